/// The parts of an http(s) URL that policy and limits need.
public struct URLParts: Sendable, Equatable {
    public var scheme: String
    public var host: String
    public var port: Int

    /// Parses `scheme://[userinfo@]host[:port][/...]`; nil for anything else.
    public init?(_ url: String) {
        let lower = url.lowercased()
        let scheme: String
        if lower.hasPrefix("http://") { scheme = "http" } else if lower.hasPrefix("https://") { scheme = "https" } else { return nil }
        var rest = url.dropFirst(scheme.count + 3)
        if let end = rest.firstIndex(where: { $0 == "/" || $0 == "?" || $0 == "#" }) { rest = rest[..<end] }
        if let at = rest.lastIndex(of: "@") { rest = rest[rest.index(after: at)...] }
        var host = String(rest)
        var port = scheme == "https" ? 443 : 80
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return nil }
            let after = host[host.index(after: close)...]
            if after.hasPrefix(":") {
                guard let parsed = Int(after.dropFirst()), (1...65535).contains(parsed) else { return nil }
                port = parsed
            } else if !after.isEmpty {
                return nil
            }
            host = String(host[...close])
        } else if let colon = host.lastIndex(of: ":") {
            guard let parsed = Int(host[host.index(after: colon)...]), (1...65535).contains(parsed) else { return nil }
            port = parsed
            host = String(host[..<colon])
        }
        guard !host.isEmpty, !host.contains(where: { $0 == " " || $0.isNewline }) else { return nil }
        self.scheme = scheme
        self.host = host.lowercased()
        self.port = port
    }

    public var hostKey: String { "\(scheme)://\(host):\(port)" }
}

public enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    public static func encode(_ bytes: [UInt8]) -> String {
        var output: [UInt8] = []
        output.reserveCapacity((bytes.count + 2) / 3 * 4)
        var index = 0
        while index + 3 <= bytes.count {
            let value = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            output += [alphabet[Int(value >> 18 & 63)], alphabet[Int(value >> 12 & 63)],
                       alphabet[Int(value >> 6 & 63)], alphabet[Int(value & 63)]]
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

    public static func decode(_ text: String) -> [UInt8]? {
        var lookup = [UInt8: UInt32]()
        for (offset, character) in alphabet.enumerated() { lookup[character] = UInt32(offset) }
        let characters = Array(text.utf8).filter { $0 != 61 }
        var output: [UInt8] = []
        var buffer: UInt32 = 0
        var bits = 0
        for character in characters {
            guard let value = lookup[character] else { return nil }
            buffer = buffer << 6 | value
            bits += 6
            if bits >= 8 {
                bits -= 8
                output.append(UInt8(buffer >> UInt32(bits) & 0xFF))
            }
        }
        return output
    }
}

/// Random identifiers from the kernel's generator.
public enum RandomID {
    /// `prefix` + 24 lower-case base-32 characters (120 random bits).
    public static func make(prefix: String) -> String {
        var bytes = [UInt8](repeating: 0, count: 15)
        fill(&bytes)
        let alphabet = Self.alphabet
        var result = prefix
        var buffer: UInt32 = 0
        var bits = 0
        for byte in bytes {
            buffer = buffer << 8 | UInt32(byte)
            bits += 8
            while bits >= 5 {
                bits -= 5
                result.append(alphabet[Int(buffer >> UInt32(bits) & 31)])
            }
        }
        return result
    }

    private static let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567")

    /// Fills `bytes` from the kernel's getrandom(2) (SystemRandomNumberGenerator), eight bytes per
    /// call: one call per byte was a tenth of the enqueue path's time.
    public static func fill(_ bytes: inout [UInt8]) {
        var generator = SystemRandomNumberGenerator()
        var index = 0
        while index < bytes.count {
            var word: UInt64 = generator.next()
            for _ in 0..<min(8, bytes.count - index) {
                bytes[index] = UInt8(truncatingIfNeeded: word)
                word >>= 8
                index += 1
            }
        }
    }

    /// A uniform random Double in 0..<1.
    public static func unit() -> Double {
        var bytes = [UInt8](repeating: 0, count: 8)
        fill(&bytes)
        let value = bytes.reduce(UInt64(0)) { $0 << 8 | UInt64($1) } >> 11
        return Double(value) / Double(1 << 53)
    }
}

extension StringProtocol {
    /// The text without its leading and trailing characters that `isTrimmed` picks (whitespace
    /// unless told otherwise): Foundation's trimmingCharacters without Foundation.
    public func trimmed(where isTrimmed: (Character) -> Bool = { $0.isWhitespace }) -> String {
        guard let first = firstIndex(where: { !isTrimmed($0) }), let last = lastIndex(where: { !isTrimmed($0) }) else { return "" }
        return String(self[first...last])
    }
}
