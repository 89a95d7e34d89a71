/// Standard base64 (RFC 4648 §4, padded), without Foundation.
public enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    public static func encode(_ bytes: [UInt8]) -> String {
        var output: [UInt8] = []
        output.reserveCapacity((bytes.count + 2) / 3 * 4)
        var index = 0
        while index + 3 <= bytes.count {
            let value = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            output += [
                alphabet[Int(value >> 18 & 63)], alphabet[Int(value >> 12 & 63)],
                alphabet[Int(value >> 6 & 63)], alphabet[Int(value & 63)],
            ]
            index += 3
        }
        let remaining = bytes.count - index
        if remaining > 0 {
            var value = UInt32(bytes[index]) << 16
            if remaining == 2 { value |= UInt32(bytes[index + 1]) << 8 }
            output += [alphabet[Int(value >> 18 & 63)], alphabet[Int(value >> 12 & 63)]]
            output += remaining == 2 ? [alphabet[Int(value >> 6 & 63)], 61] : [61, 61]
        }
        return String(decoding: output, as: UTF8.self)
    }

    /// The bytes of `text`, or nil unless it is canonical padded base64 (RFC 4648 §4): a length
    /// that is a multiple of 4, only alphabet characters, `=` only as the last one or two
    /// characters, and the unused bits before the padding zero (RFC 4648 §3.5), so that every
    /// byte string has one encoding and nothing else decodes.
    public static func decode(_ text: String) -> [UInt8]? {
        let characters = Array(text.utf8)
        guard characters.count % 4 == 0 else { return nil }
        let padding = characters.reversed().prefix { $0 == 61 }.count
        guard padding <= 2 else { return nil }
        var output: [UInt8] = []
        output.reserveCapacity(characters.count / 4 * 3)
        var buffer: UInt32 = 0
        for (index, character) in characters.dropLast(padding).enumerated() {
            guard let value = value(of: character) else { return nil }
            buffer = buffer << 6 | value
            if index % 4 == 3 {
                output += [UInt8(buffer >> 16 & 0xFF), UInt8(buffer >> 8 & 0xFF), UInt8(buffer & 0xFF)]
                buffer = 0
            }
        }
        switch padding {
        case 1:
            guard buffer & 0b11 == 0 else { return nil }
            output += [UInt8(buffer >> 10 & 0xFF), UInt8(buffer >> 2 & 0xFF)]
        case 2:
            guard buffer & 0b1111 == 0 else { return nil }
            output.append(UInt8(buffer >> 4 & 0xFF))
        default: break
        }
        return output
    }

    /// A character's value in the alphabet.
    private static func value(of character: UInt8) -> UInt32? {
        switch character {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): return UInt32(character - UInt8(ascii: "A"))
        case UInt8(ascii: "a")...UInt8(ascii: "z"): return UInt32(character - UInt8(ascii: "a")) + 26
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return UInt32(character - UInt8(ascii: "0")) + 52
        case UInt8(ascii: "+"): return 62
        case UInt8(ascii: "/"): return 63
        default: return nil
        }
    }
}
