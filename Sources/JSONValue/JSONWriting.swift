/// Compact JSON text, written directly in Swift (no json-c tree: this is on every task's path).
/// The `JSONCodec` module's json-c printer (`serializedWithJSONC`) is the reference the tests hold this
/// one to.
extension JSON {
    public func serialized() -> String {
        var writer = JSONWriter(capacity: 256)
        writer.value(self)
        return writer.text
    }

    public func serializedBytes() -> [UInt8] {
        var writer = JSONWriter(capacity: 256)
        writer.value(self)
        return writer.bytes
    }
}

/// Writes JSON text member by member straight into bytes, for the objects on every task's path (a
/// task's JSON in every API answer and event): no `JSON` tree is built to be printed. Commas come
/// by themselves: a value follows its `key`, or is the next element of the array (or the document)
/// it is written in. A writer is written through and read once; copies share their bytes.
///
/// The small members are `@inlinable`: a task's object is some thirty keys and values written from
/// other modules, and a call for each byte of punctuation was most of its cost.
public struct JSONWriter {
    @usableFromInline let output: ByteBuffer
    /// Whether the open object or array has nothing in it yet (no comma before what comes next).
    @usableFromInline var empty = true
    /// Whether a key was just written (its value needs no comma).
    @usableFromInline var afterKey = false

    public init(capacity: Int = 1024) { output = ByteBuffer(capacity: capacity) }

    public var bytes: [UInt8] { Array(output.written) }

    public var text: String { String(decoding: output.written, as: UTF8.self) }

    /// An object; `body` writes its members, each a `key` and a value.
    @inlinable
    public mutating func object(_ body: (inout JSONWriter) -> Void) { container(UInt8(ascii: "{"), UInt8(ascii: "}"), body) }

    /// An array; `body` writes its elements.
    @inlinable
    public mutating func array(_ body: (inout JSONWriter) -> Void) { container(UInt8(ascii: "["), UInt8(ascii: "]"), body) }

    @inlinable
    mutating func container(_ open: UInt8, _ close: UInt8, _ body: (inout JSONWriter) -> Void) {
        beginValue()
        output.append(open)
        let outer = empty
        empty = true
        body(&self)
        empty = outer
        output.append(close)
    }

    /// Before a value: a comma when it is not the first element, none after a key.
    @inlinable
    mutating func beginValue() {
        if afterKey {
            afterKey = false
        } else {
            if !empty { output.append(UInt8(ascii: ",")) }
            empty = false
        }
    }

    /// Starts a member named `name` (a plain ASCII name: written as it is).
    @inlinable
    public mutating func key(_ name: StaticString) {
        beginValue()
        output.appendKey(name)
        afterKey = true
    }

    /// Starts a member whose name comes from data (escaped).
    public mutating func key(named name: String) {
        beginValue()
        output.appendString(name)
        output.append(UInt8(ascii: ":"))
        afterKey = true
    }

    @inlinable
    public mutating func string(_ value: String?) {
        beginValue()
        guard let value else { return output.append("null") }
        output.appendString(value)
    }

    @inlinable
    public mutating func int(_ value: Int64?) {
        beginValue()
        guard let value else { return output.append("null") }
        output.appendInteger(value)
    }

    @inlinable
    public mutating func double(_ value: Double?) {
        beginValue()
        guard let value else { return output.append("null") }
        output.appendDouble(value)
    }

    @inlinable
    public mutating func bool(_ value: Bool) {
        beginValue()
        output.append(value ? "true" : "false")
    }

    @inlinable
    public mutating func null() {
        beginValue()
        output.append("null")
    }

    /// A value of at most `count` bytes that `body` writes in place (plain ASCII that needs no
    /// escaping, quotes included when it is a string) and whose length it returns: a timestamp
    /// goes in without a `String` made for it.
    @inlinable
    public mutating func ascii(reserving count: Int, _ body: (UnsafeMutablePointer<UInt8>) -> Int) {
        beginValue()
        output.appendInPlace(reserving: count, body)
    }

    /// A value held as a tree (the rarer, smaller parts).
    public mutating func value(_ value: JSON) {
        switch value {
        case .null: null()
        case .bool(let flag): bool(flag)
        case .int(let number): int(number)
        case .double(let number): double(number)
        case .string(let text): string(text)
        case .array(let items): array { array in for item in items { array.value(item) } }
        case .object(let members):
            object { object in
                for (name, member) in members.entries {
                    object.key(named: name)
                    object.value(member)
                }
            }
        }
    }

    /// Text that is JSON already (written by this writer or read back as stored).
    public mutating func raw(_ text: String) {
        beginValue()
        var text = text
        text.withUTF8 { output.append($0) }
    }
}

/// The bytes a `JSONWriter` has written, appended through a raw pointer: JSON is written a few
/// bytes at a time, and an array's append goes through its uniqueness and capacity checks for
/// every piece (a third of the cost of writing a task).
@usableFromInline
final class ByteBuffer {
    // Unchecked: the buffer belongs to one writer, used by one thread; the dynamic exclusivity
    // check on each access of a class's property from another module cost more than the append.
    @exclusivity(unchecked) @usableFromInline var base: UnsafeMutablePointer<UInt8>
    @exclusivity(unchecked) @usableFromInline var count = 0
    @exclusivity(unchecked) @usableFromInline var capacity: Int

    init(capacity: Int) {
        self.capacity = max(capacity, 64)
        base = .allocate(capacity: self.capacity)
    }

    deinit { base.deallocate() }

    var written: UnsafeBufferPointer<UInt8> { UnsafeBufferPointer(start: base, count: count) }

    @inlinable
    func append(_ byte: UInt8) {
        if count == capacity { grow(by: 1) }
        base[count] = byte
        count += 1
    }

    @inlinable
    func append(_ bytes: UnsafeBufferPointer<UInt8>) {
        guard let source = bytes.baseAddress else { return }
        if capacity - count < bytes.count { grow(by: bytes.count) }
        (base + count).update(from: source, count: bytes.count)
        count += bytes.count
    }

    @inlinable
    func append(_ text: StaticString) {
        if text.hasPointerRepresentation {
            append(UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
        } else {
            text.withUTF8Buffer { append($0) }
        }
    }

    /// `"name":`, reserved once.
    @inlinable
    func appendKey(_ name: StaticString) {
        guard name.hasPointerRepresentation else {
            append(UInt8(ascii: "\""))
            append(name)
            return append("\":")
        }
        let length = name.utf8CodeUnitCount
        if capacity - count < length + 3 { grow(by: length + 3) }
        let start = base + count
        start[0] = UInt8(ascii: "\"")
        (start + 1).update(from: name.utf8Start, count: length)
        start[length + 1] = UInt8(ascii: "\"")
        start[length + 2] = UInt8(ascii: ":")
        count += length + 3
    }

    @inlinable
    func appendInPlace(reserving needed: Int, _ body: (UnsafeMutablePointer<UInt8>) -> Int) {
        if capacity - count < needed { grow(by: needed) }
        let written = body(base + count)
        assert(written >= 0 && written <= needed, "wrote \(written) bytes in room for \(needed)")
        count += written
    }

    @usableFromInline
    func grow(by needed: Int) {
        capacity = max(capacity * 2, count + needed)
        let larger = UnsafeMutablePointer<UInt8>.allocate(capacity: capacity)
        larger.update(from: base, count: count)
        base.deallocate()
        base = larger
    }

    /// Decimal digits, most significant first, written backwards into reserved room.
    @usableFromInline
    func appendInteger(_ value: Int64) {
        if capacity - count < 20 { grow(by: 20) }
        if value < 0 {
            base[count] = UInt8(ascii: "-")
            count += 1
        }
        var magnitude = value.magnitude
        var digits = 0
        var probe = magnitude
        repeat {
            digits += 1
            probe /= 10
        } while probe > 0
        var position = count + digits
        repeat {
            position -= 1
            base[position] = UInt8(ascii: "0") + UInt8(magnitude % 10)
            magnitude /= 10
        } while magnitude > 0
        count += digits
    }

    /// As json-c prints a double: `null` when not finite, a whole number with `.0` (so that it
    /// reads back a double), otherwise the shortest text that reads back the same. A number with
    /// at most six decimals (a priority of 0.5, a fraction of 0.25) is written from its digits:
    /// when n ÷ 10ᵏ, divided in floating point, gives the value back, the text of n with k
    /// decimals reads back as that value, and the smallest such k is the shortest text.
    @usableFromInline
    func appendDouble(_ value: Double) {
        guard value.isFinite else { return append("null") }
        if value == value.rounded(), abs(value) < 1e15 {
            appendInteger(Int64(value))
            return append(".0")
        }
        let magnitude = abs(value)
        if magnitude >= 0.001, magnitude < 1e9 {
            var scale = 10.0
            for decimals in 1...6 {
                let scaled = (magnitude * scale).rounded()
                if scaled / scale == magnitude {
                    let whole = Int64(scaled) / Int64(scale)
                    var fraction = Int64(scaled) % Int64(scale)
                    if value < 0 { append(UInt8(ascii: "-")) }
                    appendInteger(whole)
                    append(UInt8(ascii: "."))
                    var divisor = Int64(scale) / 10
                    for _ in 0..<decimals {
                        append(UInt8(ascii: "0") + UInt8(fraction / divisor))
                        fraction %= divisor
                        divisor /= 10
                    }
                    return
                }
                scale *= 10
            }
        }
        var text = String(value)
        text.withUTF8 { append($0) }
    }

    private static let hex: StaticString = "0123456789abcdef"

    /// A string literal: `"` and `\\` escaped, control characters as `\uXXXX` (the short forms
    /// for the common ones), everything else as UTF-8. The bytes are read in place and copied a
    /// run at a time between the characters that need escaping, found eight bytes at a time.
    @usableFromInline
    func appendString(_ text: String) {
        var text = text
        text.withUTF8 { appendEscaped($0) }
    }

    private func appendEscaped(_ bytes: UnsafeBufferPointer<UInt8>) {
        append(UInt8(ascii: "\""))
        let raw = UnsafeRawBufferPointer(bytes)
        var start = 0
        var index = 0
        while index < bytes.count {
            if index + 8 <= bytes.count, !Self.needsEscape(raw.loadUnaligned(fromByteOffset: index, as: UInt64.self)) {
                index += 8
                continue
            }
            let byte = bytes[index]
            index += 1
            guard byte < 0x20 || byte == 34 || byte == 92 else { continue }
            append(UnsafeBufferPointer(rebasing: bytes[start..<index - 1]))
            start = index
            switch byte {
            case 34: append("\\\"")
            case 92: append("\\\\")
            case 10: append("\\n")
            case 13: append("\\r")
            case 9: append("\\t")
            case 8: append("\\b")
            case 12: append("\\f")
            default:
                append("\\u00")
                Self.hex.withUTF8Buffer { digits in
                    append(digits[Int(byte >> 4)])
                    append(digits[Int(byte & 15)])
                }
            }
        }
        append(UnsafeBufferPointer(rebasing: bytes[start..<bytes.count]))
        append(UInt8(ascii: "\""))
    }

    /// Whether any of eight bytes is a control character, `"` or `\\`: the usual test for a zero
    /// byte, on the word itself for bytes under 0x20 and on the word xor each quote character.
    private static func needsEscape(_ word: UInt64) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        func hasZeroByte(_ value: UInt64) -> Bool { (value &- ones) & ~value & highs != 0 }
        // A byte under 0x20: subtracting 0x20 borrows into its high bit (bytes from 0x80 keep theirs).
        let control = (word &- ones &* 0x20) & ~word & highs != 0
        return control || hasZeroByte(word ^ (ones &* 0x22)) || hasZeroByte(word ^ (ones &* 0x5C))
    }
}
