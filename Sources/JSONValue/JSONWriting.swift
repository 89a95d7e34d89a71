/// Compact JSON text, written directly in Swift (no json-c tree: this is on every task's path).
/// The `JSON` module's json-c printer (`serializedWithJSONC`) is the reference the tests hold this
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
public struct JSONWriter {
    private let output: ByteBuffer
    /// Whether the open object or array has nothing in it yet (no comma before what comes next).
    private var empty = true
    /// Whether a key was just written (its value needs no comma).
    private var afterKey = false

    public init(capacity: Int = 1024) { output = ByteBuffer(capacity: capacity) }

    public var bytes: [UInt8] { Array(output.written) }

    public var text: String { String(decoding: output.written, as: UTF8.self) }

    /// An object; `body` writes its members, each a `key` and a value.
    public mutating func object(_ body: (inout JSONWriter) -> Void) { container(UInt8(ascii: "{"), UInt8(ascii: "}"), body) }

    /// An array; `body` writes its elements.
    public mutating func array(_ body: (inout JSONWriter) -> Void) { container(UInt8(ascii: "["), UInt8(ascii: "]"), body) }

    private mutating func container(_ open: UInt8, _ close: UInt8, _ body: (inout JSONWriter) -> Void) {
        beginValue()
        output.append(open)
        let outer = empty
        empty = true
        body(&self)
        empty = outer
        output.append(close)
    }

    /// Before a value: a comma when it is not the first element, none after a key.
    private mutating func beginValue() {
        if afterKey {
            afterKey = false
        } else {
            if !empty { output.append(UInt8(ascii: ",")) }
            empty = false
        }
    }

    /// Starts a member named `name` (a plain ASCII name: written as it is).
    public mutating func key(_ name: StaticString) {
        beginValue()
        output.append(UInt8(ascii: "\""))
        output.append(name)
        output.append("\":")
        afterKey = true
    }

    /// Starts a member whose name comes from data (escaped).
    public mutating func key(named name: String) {
        beginValue()
        output.appendString(name)
        output.append(UInt8(ascii: ":"))
        afterKey = true
    }

    public mutating func string(_ value: String?) {
        beginValue()
        guard let value else { return output.append("null") }
        output.appendString(value)
    }

    public mutating func int(_ value: Int64?) {
        beginValue()
        guard let value else { return output.append("null") }
        output.appendInteger(value)
    }

    public mutating func double(_ value: Double?) {
        beginValue()
        guard let value else { return output.append("null") }
        output.appendDouble(value)
    }

    public mutating func bool(_ value: Bool) {
        beginValue()
        output.append(value ? "true" : "false")
    }

    public mutating func null() {
        beginValue()
        output.append("null")
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
private final class ByteBuffer {
    private var base: UnsafeMutablePointer<UInt8>
    private var count = 0
    private var capacity: Int

    init(capacity: Int) {
        self.capacity = max(capacity, 64)
        base = .allocate(capacity: self.capacity)
    }

    deinit { base.deallocate() }

    var written: UnsafeBufferPointer<UInt8> { UnsafeBufferPointer(start: base, count: count) }

    func append(_ byte: UInt8) {
        if count == capacity { grow(by: 1) }
        base[count] = byte
        count += 1
    }

    func append(_ bytes: UnsafeBufferPointer<UInt8>) {
        guard let source = bytes.baseAddress else { return }
        if capacity - count < bytes.count { grow(by: bytes.count) }
        (base + count).update(from: source, count: bytes.count)
        count += bytes.count
    }

    func append(_ text: StaticString) {
        text.withUTF8Buffer { append($0) }
    }

    private func grow(by needed: Int) {
        capacity = max(capacity * 2, count + needed)
        let larger = UnsafeMutablePointer<UInt8>.allocate(capacity: capacity)
        larger.update(from: base, count: count)
        base.deallocate()
        base = larger
    }

    /// Decimal digits, most significant first, through a fixed buffer on the stack.
    func appendInteger(_ value: Int64) {
        if value < 0 { append(UInt8(ascii: "-")) }
        var magnitude = value.magnitude
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { digits in
            var start = 20
            repeat {
                start -= 1
                digits[start] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
            } while magnitude > 0
            append(UnsafeBufferPointer(rebasing: digits[start..<20]))
        }
    }

    /// As json-c prints a double: `null` when not finite, a whole number with `.0` (so that it
    /// reads back a double), otherwise the shortest text that reads back the same.
    func appendDouble(_ value: Double) {
        guard value.isFinite else { return append("null") }
        if value == value.rounded(), abs(value) < 1e15 {
            appendInteger(Int64(value))
            append(".0")
        } else {
            var text = String(value)
            text.withUTF8 { append($0) }
        }
    }

    private static let hex: StaticString = "0123456789abcdef"

    /// A string literal: `"` and `\\` escaped, control characters as `\uXXXX` (the short forms
    /// for the common ones), everything else as UTF-8. The bytes are read in place and copied a
    /// run at a time between the characters that need escaping, found eight bytes at a time.
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
