import CJSONC
@_exported import JSONValue

/// A parse failure with json-c's own description and the byte offset where it stopped.
public struct JSONParseError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public var offset: Int
    public var description: String { "\(message) at byte \(offset)" }
}

extension JSON {
    /// Parses a complete JSON text (RFC 8259, strict, UTF-8 checked) with a nesting limit.
    /// Calls `json_tokener_new_ex`, `json_tokener_parse_ex`, `json_tokener_get_error`.
    public static func parse(_ bytes: some Collection<UInt8>, maxDepth: Int = 32) throws(JSONParseError) -> JSON {
        let array = Array(bytes)
        if let offset = singleQuoteOutsideString(array) {
            // json-c accepts 'single-quoted' strings even in strict mode; RFC 8259 does not.
            throw JSONParseError(message: "single-quoted strings are not JSON", offset: offset)
        }
        guard let tokener = json_tokener_new_ex(Int32(maxDepth)) else {
            throw JSONParseError(message: "out of memory", offset: 0)
        }
        defer { json_tokener_free(tokener) }
        json_tokener_set_flags(tokener, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8)
        let parsed: OpaquePointer? = array.withUnsafeBufferPointer { buffer in
            buffer.baseAddress!.withMemoryRebound(to: CChar.self, capacity: max(buffer.count, 1)) {
                json_tokener_parse_ex(tokener, $0, Int32(buffer.count))
            }
        }
        let code = json_tokener_get_error(tokener)
        let end = Int(json_tokener_get_parse_end(tokener))
        if code == json_tokener_continue || (code == json_tokener_success && parsed == nil && array.isEmpty) {
            if let parsed { json_object_put(parsed) }
            throw JSONParseError(message: "unexpected end of input", offset: array.count)
        }
        guard code == json_tokener_success else {
            if let parsed { json_object_put(parsed) }
            throw JSONParseError(message: String(cString: json_tokener_error_desc(code)), offset: end)
        }
        defer { if let parsed { json_object_put(parsed) } }
        var rest = end
        while rest < array.count, [0x20, 0x09, 0x0A, 0x0D].contains(array[rest]) { rest += 1 }
        guard rest == array.count else {
            throw JSONParseError(message: "unexpected data after the JSON value", offset: end)
        }
        return try JSON(borrowing: parsed)
    }

    private static func singleQuoteOutsideString(_ bytes: [UInt8]) -> Int? {
        var inString = false
        var escaped = false
        for (offset, byte) in bytes.enumerated() {
            if inString {
                if escaped { escaped = false } else if byte == 0x5C { escaped = true } else if byte == 0x22 { inString = false }
            } else if byte == 0x22 {
                inString = true
            } else if byte == 0x27 {
                return offset
            }
        }
        return nil
    }

    public static func parse(_ text: String, maxDepth: Int = 32) throws(JSONParseError) -> JSON {
        try parse(Array(text.utf8), maxDepth: maxDepth)
    }

    /// Converts a json-c tree (borrowed, not released here). Numbers json-c could only saturate
    /// (integers past UInt64.max) or that overflow a double (`1e400`) are refused rather than
    /// silently changed.
    private init(borrowing object: OpaquePointer?) throws(JSONParseError) {
        guard let object else {
            self = .null
            return
        }
        switch json_object_get_type(object) {
        case json_type_null: self = .null
        case json_type_boolean: self = .bool(json_object_get_boolean(object) != 0)
        case json_type_int:
            // json-c keeps integers above Int64.max as uint64; those become doubles here.
            let value = json_object_get_int64(object)
            if value == Int64.max, json_object_get_uint64(object) > UInt64(Int64.max) {
                let unsigned = json_object_get_uint64(object)
                guard unsigned < UInt64.max else { throw JSONParseError(message: "a number is out of range", offset: 0) }
                self = .double(Double(unsigned))
            } else {
                self = .int(value)
            }
        case json_type_double:
            let value = json_object_get_double(object)
            guard value.isFinite else { throw JSONParseError(message: "a number is out of range", offset: 0) }
            self = .double(value)
        case json_type_string:
            let length = Int(json_object_get_string_len(object))
            let pointer = json_object_get_string(object)!
            let buffer = UnsafeRawBufferPointer(start: pointer, count: length)
            self = .string(String(decoding: buffer, as: UTF8.self))
        case json_type_array:
            let count = json_object_array_length(object)
            var items: [JSON] = []
            items.reserveCapacity(count)
            for index in 0..<count { items.append(try JSON(borrowing: json_object_array_get_idx(object, index))) }
            self = .array(items)
        case json_type_object:
            var result = JSONObject()
            var iterator = json_object_iter_begin(object)
            var end = json_object_iter_end(object)
            while json_object_iter_equal(&iterator, &end) == 0 {
                let name = String(cString: json_object_iter_peek_name(&iterator))
                result[name] = try JSON(borrowing: json_object_iter_peek_value(&iterator))
                json_object_iter_next(&iterator)
            }
            self = .object(result)
        default: self = .null
        }
    }
}

extension JSON {
    /// The same value printed by json-c (`json_object_to_json_string_length`): the reference the
    /// tests hold `serialized` to.
    public func serializedWithJSONC() -> String {
        let object = makeObject()
        defer { if let object { json_object_put(object) } }
        guard let object else { return "null" }
        var length = 0
        let flags = JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE
        guard let text = json_object_to_json_string_length(object, flags, &length) else { return "null" }
        return String(decoding: UnsafeRawBufferPointer(start: text, count: length), as: UTF8.self)
    }

    /// Builds a new json-c tree; the caller owns the returned reference.
    private func makeObject() -> OpaquePointer? {
        switch self {
        case .null: return nil
        case .bool(let b): return json_object_new_boolean(b ? 1 : 0)
        case .int(let i): return json_object_new_int64(i)
        case .double(let d):
            guard d.isFinite else { return nil }
            return json_object_new_double(d)
        case .string(let s):
            var copy = s
            return copy.withUTF8 { buffer in
                buffer.withMemoryRebound(to: CChar.self) { chars in
                    chars.isEmpty
                        ? json_object_new_string("") : json_object_new_string_len(chars.baseAddress!, Int32(chars.count))
                }
            }
        case .array(let items):
            let array = json_object_new_array_ext(Int32(items.count))
            for item in items { json_object_array_add(array, item.makeObject()) }
            return array
        case .object(let members):
            let object = json_object_new_object()
            for (key, value) in members { json_object_object_add(object, key, value.makeObject()) }
            return object
        }
    }
}
