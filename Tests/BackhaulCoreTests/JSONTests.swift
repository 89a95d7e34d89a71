import JSONCodec
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

    @Test(
        "malformed input is refused with a position",
        arguments: [
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
        #expect(items[2].doubleValue == Double(UInt64.max - 1) && items[3].doubleValue == 1e300)
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

@Suite("JSON writer")
struct JSONWriterTests {
    struct Seeded: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            return state
        }
    }

    static let strings = [
        "", "plain", "quote \" and \\ backslash", "tab\tnew\nline\rcr", "nul \u{0}", "\u{1}\u{1f}\u{7f}",
        "héllo 😀", "/slash/", "\u{2028}", "{\"not\": \"json\"}",
    ]

    static func value(_ random: inout Seeded, depth: Int) -> JSON {
        switch random.next() % (depth > 3 ? 5 : 7) {
        case 0: return .null
        case 1: return .bool(random.next() % 2 == 0)
        case 2: return .int(Int64(bitPattern: random.next()) >> Int64(random.next() % 60))
        case 3:
            let doubles: [Double] = [0.1, -2.5, 1e-7, 123456789.125, 1e300, -0.0, 3.0, Double(Int64.max), .leastNonzeroMagnitude]
            return .double(doubles[Int(random.next() % UInt64(doubles.count))])
        case 4: return .string(strings[Int(random.next() % UInt64(strings.count))])
        case 5: return .array((0..<Int(random.next() % 4)).map { _ in value(&random, depth: depth + 1) })
        default:
            var object = JSONObject()
            for index in 0..<Int(random.next() % 4) {
                object["k\(index)\(strings[index % strings.count])"] = value(&random, depth: depth + 1)
            }
            return .object(object)
        }
    }

    @Test("what the writer prints, json-c parses back to the same value, as it does json-c's own print")
    func differential() throws {
        var random = Seeded(state: 0x9e37_79b9_7f4a_7c15)
        for _ in 0..<2_000 {
            // In an array: json-c reads a bare top-level number only once it knows it ended.
            let value = JSON.array([Self.value(&random, depth: 0)])
            let written = value.serialized()
            #expect(try JSON.parse(written, maxDepth: 64) == value, "\(written)")
            #expect(try JSON.parse(written, maxDepth: 64) == JSON.parse(value.serializedWithJSONC(), maxDepth: 64))
            #expect(value.serializedBytes() == Array(written.utf8))
        }
    }

    /// Strings are scanned eight bytes at a time for what needs escaping: every such byte, and
    /// the bytes next to those ranges, at every position of the first three words.
    @Test("a character that needs escaping is escaped wherever it stands in a long string")
    func escapesAtEveryPosition() throws {
        let specials: [UInt8] = [0x00, 0x01, 0x08, 0x09, 0x0A, 0x0C, 0x0D, 0x1F, 0x20, 0x21, 0x22, 0x5B, 0x5C, 0x5D, 0x7F]
        for special in specials {
            for position in 0..<24 {
                var bytes = [UInt8](repeating: UInt8(ascii: "a"), count: 24)
                bytes[position] = special
                let text = String(decoding: bytes + Array("é😀".utf8), as: UTF8.self)
                let written = JSON.array([.string(text)]).serialized()
                #expect(try JSON.parse(written) == JSON.array([.string(text)]), "\(special) at \(position): \(written)")
                #expect(written.utf8.allSatisfy { $0 >= 0x20 }, "no raw control byte: \(special) at \(position)")
            }
        }
    }

    /// Writes `value` through `JSONWriter`, member by member, as the task's JSON is written.
    static func stream(_ value: JSON, to writer: inout JSONWriter) {
        switch value {
        case .null: writer.null()
        case .bool(let flag): writer.bool(flag)
        case .int(let number): writer.int(number)
        case .double(let number): writer.double(number)
        case .string(let text): writer.string(text)
        case .array(let items):
            writer.array { array in
                for item in items {
                    stream(item, to: &array)
                }
            }
        case .object(let members):
            writer.object { object in
                for (key, member) in members {
                    object.key(named: key)
                    stream(member, to: &object)
                }
            }
        }
    }

    @Test("JSONWriter writes, member by member, the same bytes as the value's own writer")
    func streamingWriter() throws {
        var random = Seeded(state: 0x2545_f491_4f6c_dd1d)
        for _ in 0..<2_000 {
            let value = Self.value(&random, depth: 0)
            var writer = JSONWriter(capacity: 16)
            Self.stream(value, to: &writer)
            // json-c is the reference: it reads back the value it was written from, as it reads its own print.
            let wrapped = "[" + writer.text + "]"
            #expect(try JSON.parse(wrapped, maxDepth: 64) == JSON.array([value]), "\(wrapped)")
            #expect(try JSON.parse(wrapped, maxDepth: 64) == JSON.parse("[" + value.serializedWithJSONC() + "]", maxDepth: 64))
            #expect(writer.bytes == value.serializedBytes(), "\(value.serialized())")
        }
        var writer = JSONWriter()
        writer.object { object in
            object.key("a")
            object.string(nil)
            object.key("b")
            object.raw("{}")
            object.key("c")
            object.value(["x": [1, 2.5]])
        }
        #expect(writer.text == #"{"a":null,"b":{},"c":{"x":[1,2.5]}}"#)
        // Arrays and the document itself: commas between elements, none after a key.
        var list = JSONWriter()
        list.array { array in
            array.int(1)
            array.object { _ in }
            array.array { inner in
                inner.string("a")
                inner.null()
            }
            array.raw("{}")
        }
        #expect(list.text == #"[1,{},["a",null],{}]"#)
    }

    /// Doubles with at most six decimals are written from their digits; every other one through
    /// Swift's shortest text. Both must give the shortest text that reads back the same double.
    @Test("a double is written as its shortest text that reads back the same, with or without the digit path")
    func doubles() throws {
        var random = Seeded(state: 0x5851_f42d_4c95_7f2d)
        var values: [Double] = [
            0.5, 0.25, 0.1, 0.2, 0.3, 0.7, 1.1, 2.675, -0.001, 0.001, 0.0015, 999_999_999.5, 1e9 + 0.5, 0.000999,
        ]
        for _ in 0..<20_000 {
            let digits = Double(random.next() % 10_000_000) / [10.0, 100, 1000, 1e4, 1e5, 1e6, 1e7][Int(random.next() % 7)]
            values.append(random.next() % 2 == 0 ? digits : -digits)
            values.append(Double(bitPattern: random.next() % 0x4200_0000_0000_0000))
        }
        for value in values where value.isFinite {
            var writer = JSONWriter(capacity: 8)
            writer.double(value)
            let expected = value == value.rounded() && abs(value) < 1e15 ? "\(Int64(value)).0" : String(value)
            #expect(writer.text == expected, "\(value)")
            #expect(Double(writer.text) == value)
        }
    }

    @Test(
        "control characters are escaped; nothing else is",
        arguments: [
            (JSON.string("a\"b\\c\n\u{0}"), #""a\"b\\c\n\u0000""#),
            (JSON.string("é/😀"), "\"é/😀\""),
            (JSON.double(3), "3.0"), (JSON.double(0.5), "0.5"), (JSON.int(-7), "-7"), (JSON.double(.infinity), "null"),
            (["b": 1, "a": [true, nil]], #"{"b":1,"a":[true,null]}"#),
        ] as [(JSON, String)])
    func exact(value: JSON, text: String) {
        #expect(value.serialized() == text)
    }
}
