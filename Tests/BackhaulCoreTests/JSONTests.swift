import JSON
import Testing

@Suite("JSON over json-c")
struct JSONTests {
    @Test("round trip keeps order, types and non-ASCII text")
    func roundTrip() throws {
        let text = #"{"b":1,"a":[true,null,2.5,"h\u00e9llo \ud83d\ude00"],"c":{"d":-7}}"#
        let value = try JSON.parse(text)
        #expect(value["b"] == .int(1))
        #expect(value["a"]?.arrayValue?[3] == .string("héllo 😀"))
        #expect(value.objectValue?.keys == ["b", "a", "c"])
        #expect(try JSON.parse(value.serialized()) == value)
    }

    @Test("NUL characters inside strings survive")
    func nulInString() throws {
        let value = try JSON.parse(#"{"k":"a\u0000b"}"#)
        #expect(value["k"]?.stringValue?.utf8.count == 3)
        #expect(try JSON.parse(value.serialized()) == value)
    }

    @Test("malformed input is refused with a position", arguments: [
        "", "{", "{\"a\":}", "[1,]", "{'a':1}", "nul", "{\"a\":1} x", "\"\\x\"", "[1 2]", "01",
    ])
    func malformed(_ text: String) {
        #expect(throws: JSONParseError.self) { try JSON.parse(text) }
    }

    @Test("invalid UTF-8 is refused")
    func invalidUTF8() {
        #expect(throws: JSONParseError.self) { try JSON.parse([0x22, 0xC3, 0x28, 0x22]) }
        #expect(throws: JSONParseError.self) { try JSON.parse([0x22, 0xFF, 0x22]) }
    }

    @Test("nesting deeper than the limit is refused")
    func depth() throws {
        let deep = String(repeating: "[", count: 40) + String(repeating: "]", count: 40)
        #expect(throws: JSONParseError.self) { try JSON.parse(deep, maxDepth: 32) }
        #expect(try JSON.parse(deep, maxDepth: 64).arrayValue != nil)
    }

    @Test("huge numbers: exact where they fit, refused where they would change")
    func hugeNumbers() throws {
        let value = try JSON.parse("[-9223372036854775808, 9223372036854775807, 18446744073709551614, 1e300]")
        let items = try #require(value.arrayValue)
        #expect(items[0] == .int(Int64.min) && items[1] == .int(Int64.max))
        #expect(items[2].doubleValue == 18446744073709551614 && items[3].doubleValue == 1e300)
        for text in ["[123456789012345678901234567890]", "[1e400]", "[-1e400]", "{\"a\": 18446744073709551615}"] {
            #expect(throws: JSONParseError.self, "\(text)") { try JSON.parse(text) }
        }
    }

    @Test("objects compare without regard to key order")
    func objectEquality() throws {
        #expect(try JSON.parse(#"{"a":1,"b":2}"#) == JSON.parse(#"{"b":2,"a":1}"#))
        #expect(try JSON.parse(#"{"a":1}"#) != JSON.parse(#"{"a":1,"b":2}"#))
    }
}
