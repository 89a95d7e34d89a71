/// Compact JSON text, written directly in Swift (no json-c tree: this is on every task's path).
/// The `JSON` module's json-c printer (`serializedWithJSONC`) is the reference the tests hold this
/// one to.
extension JSON {
    public func serialized() -> String {
        var output: [UInt8] = []
        output.reserveCapacity(256)
        write(to: &output)
        return String(decoding: output, as: UTF8.self)
    }

    public func serializedBytes() -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(256)
        write(to: &output)
        return output
    }

    /// Appends the compact text of this value. Nothing is allocated but `output`'s growth: it runs
    /// for every task row, event and API answer.
    public func write(to output: inout [UInt8]) {
        switch self {
        case .null: JSON.append("null", to: &output)
        case .bool(let value): JSON.append(value ? "true" : "false", to: &output)
        case .int(let value): JSON.writeInteger(value, to: &output)
        case .double(let value):
            guard value.isFinite else {
                JSON.append("null", to: &output)
                return
            }
            if value == value.rounded(), abs(value) < 1e15 {
                // A whole double keeps a fraction, as json-c prints it, so it reads back a double.
                JSON.writeInteger(Int64(value), to: &output)
                JSON.append(".0", to: &output)
            } else {
                output.append(contentsOf: String(value).utf8)
            }
        case .string(let text): JSON.writeString(text, to: &output)
        case .array(let items):
            output.append(UInt8(ascii: "["))
            var first = true
            for item in items {
                if !first { output.append(UInt8(ascii: ",")) }
                first = false
                item.write(to: &output)
            }
            output.append(UInt8(ascii: "]"))
        case .object(let members):
            output.append(UInt8(ascii: "{"))
            var first = true
            for (key, value) in members.entries {
                if !first { output.append(UInt8(ascii: ",")) }
                first = false
                JSON.writeString(key, to: &output)
                output.append(UInt8(ascii: ":"))
                value.write(to: &output)
            }
            output.append(UInt8(ascii: "}"))
        }
    }

    static func append(_ text: StaticString, to output: inout [UInt8]) {
        text.withUTF8Buffer { output.append(contentsOf: $0) }
    }

    /// Decimal digits, most significant first, through a fixed buffer on the stack.
    static func writeInteger(_ value: Int64, to output: inout [UInt8]) {
        if value < 0 { output.append(UInt8(ascii: "-")) }
        var magnitude = value.magnitude
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { digits in
            var start = 20
            repeat {
                start -= 1
                digits[start] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
            } while magnitude > 0
            output.append(contentsOf: UnsafeBufferPointer(rebasing: digits[start..<20]))
        }
    }

    private static let hex: [UInt8] = Array("0123456789abcdef".utf8)

    /// A string literal: `"` and `\\` escaped, control characters as `\uXXXX` (the short forms
    /// for the common ones), everything else as UTF-8. The bytes are read in place (no copy of
    /// the string) and appended a run at a time between the characters that need escaping.
    static func writeString(_ text: String, to output: inout [UInt8]) {
        let written: Void? = text.utf8.withContiguousStorageIfAvailable { writeEscaped($0, to: &output) }
        if written == nil { Array(text.utf8).withUnsafeBufferPointer { writeEscaped($0, to: &output) } }
    }

    private static func writeEscaped(_ bytes: UnsafeBufferPointer<UInt8>, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "\""))
        var start = 0
        for index in 0..<bytes.count {
            let byte = bytes[index]
            guard byte < 0x20 || byte == 34 || byte == 92 else { continue }
            output.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<index]))
            start = index + 1
            switch byte {
            case 34: append("\\\"", to: &output)
            case 92: append("\\\\", to: &output)
            case 10: append("\\n", to: &output)
            case 13: append("\\r", to: &output)
            case 9: append("\\t", to: &output)
            case 8: append("\\b", to: &output)
            case 12: append("\\f", to: &output)
            default:
                append("\\u00", to: &output)
                output.append(hex[Int(byte >> 4)])
                output.append(hex[Int(byte & 15)])
            }
        }
        output.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<bytes.count]))
        output.append(UInt8(ascii: "\""))
    }
}

/// Writes JSON text member by member straight into bytes, for the objects on every task's path (a
/// task's JSON in every API answer and event): no `JSON` tree is built to be printed. Numbers and strings are written exactly as
/// `JSON.write(to:)` writes them. Commas come by themselves: a value follows its `key`, or is
/// the next element of the array (or the document) it is written in.
public struct JSONWriter {
    public private(set) var bytes: [UInt8] = []
    /// Whether the open object or array has nothing in it yet (no comma before what comes next).
    private var empty = true
    /// Whether a key was just written (its value needs no comma).
    private var afterKey = false

    public init(capacity: Int = 1024) { bytes.reserveCapacity(capacity) }

    public var text: String { String(decoding: bytes, as: UTF8.self) }

    /// An object; `body` writes its members, each a `key` and a value.
    public mutating func object(_ body: (inout JSONWriter) -> Void) { container(UInt8(ascii: "{"), UInt8(ascii: "}"), body) }

    /// An array; `body` writes its elements.
    public mutating func array(_ body: (inout JSONWriter) -> Void) { container(UInt8(ascii: "["), UInt8(ascii: "]"), body) }

    private mutating func container(_ open: UInt8, _ close: UInt8, _ body: (inout JSONWriter) -> Void) {
        beginValue()
        bytes.append(open)
        let outer = empty
        empty = true
        body(&self)
        empty = outer
        bytes.append(close)
    }

    /// Before a value: a comma when it is not the first element, none after a key.
    private mutating func beginValue() {
        if afterKey {
            afterKey = false
        } else {
            if !empty { bytes.append(UInt8(ascii: ",")) }
            empty = false
        }
    }

    /// Starts a member named `name` (a plain ASCII name: written as it is).
    public mutating func key(_ name: StaticString) {
        beginValue()
        bytes.append(UInt8(ascii: "\""))
        name.withUTF8Buffer { bytes.append(contentsOf: $0) }
        JSON.append("\":", to: &bytes)
        afterKey = true
    }

    /// Starts a member whose name comes from data (escaped).
    public mutating func key(named name: String) {
        beginValue()
        JSON.writeString(name, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        afterKey = true
    }

    public mutating func string(_ value: String?) {
        beginValue()
        guard let value else { return JSON.append("null", to: &bytes) }
        JSON.writeString(value, to: &bytes)
    }

    public mutating func int(_ value: Int64?) {
        beginValue()
        guard let value else { return JSON.append("null", to: &bytes) }
        JSON.writeInteger(value, to: &bytes)
    }

    public mutating func double(_ value: Double?) {
        beginValue()
        guard let value else { return JSON.append("null", to: &bytes) }
        JSON.double(value).write(to: &bytes)
    }

    public mutating func bool(_ value: Bool) {
        beginValue()
        JSON.append(value ? "true" : "false", to: &bytes)
    }

    public mutating func null() {
        beginValue()
        JSON.append("null", to: &bytes)
    }

    /// A value held as a tree (the rarer, smaller parts).
    public mutating func value(_ value: JSON) {
        beginValue()
        value.write(to: &bytes)
    }

    /// Text that is JSON already (written by this writer or read back as stored).
    public mutating func raw(_ text: String) {
        beginValue()
        bytes.append(contentsOf: text.utf8)
    }
}
