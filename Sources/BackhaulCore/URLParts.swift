/// The parts of an http(s) URL that policy and limits need.
public struct URLParts: Sendable, Equatable {
    public var scheme: String
    public var host: String
    public var port: Int

    /// Parses `scheme://[userinfo@]host[:port][/...]`; nil for anything else. Works on the UTF-8
    /// bytes (it runs several times per task at enqueue): the scheme is matched without regard to
    /// case, the host is lower-cased, the port is 1–65535 in decimal digits only.
    public init?(_ url: String) {
        var url = url
        guard let parsed = url.withUTF8({ Self.parse($0) }) else { return nil }
        self = parsed
    }

    public var hostKey: String { "\(scheme)://\(host):\(port)" }

    private static func parse(_ bytes: UnsafeBufferPointer<UInt8>) -> URLParts? {
        let scheme: String
        var start: Int
        if hasPrefix(bytes, "http://") {
            scheme = "http"
            start = 7
        } else if hasPrefix(bytes, "https://") {
            scheme = "https"
            start = 8
        } else {
            return nil
        }
        // The authority ends at the path, the query or the fragment; userinfo ends at its last '@'.
        var end = start
        while end < bytes.count, bytes[end] != UInt8(ascii: "/"), bytes[end] != UInt8(ascii: "?"),
            bytes[end] != UInt8(ascii: "#")
        {
            if bytes[end] == UInt8(ascii: "@") { start = end + 1 }
            end += 1
        }
        var hostEnd = end
        var port = scheme == "https" ? 443 : 80
        if start < end, bytes[start] == UInt8(ascii: "[") {
            guard let close = (start..<end).first(where: { bytes[$0] == UInt8(ascii: "]") }) else { return nil }
            hostEnd = close + 1
            if hostEnd < end {
                guard bytes[hostEnd] == UInt8(ascii: ":"), let parsed = self.port(bytes, hostEnd + 1, end) else { return nil }
                port = parsed
            }
        } else if let colon = (start..<end).last(where: { bytes[$0] == UInt8(ascii: ":") }) {
            guard let parsed = self.port(bytes, colon + 1, end) else { return nil }
            port = parsed
            hostEnd = colon
        }
        let host = UnsafeBufferPointer(rebasing: bytes[start..<hostEnd])
        guard !host.isEmpty, !containsSpaceOrNewline(host) else { return nil }
        return URLParts(scheme: scheme, host: String(decoding: host, as: UTF8.self).asciiLowercased, port: port)
    }

    private init(scheme: String, host: String, port: Int) {
        self.scheme = scheme
        self.host = host
        self.port = port
    }

    private static func hasPrefix(_ bytes: UnsafeBufferPointer<UInt8>, _ prefix: StaticString) -> Bool {
        guard bytes.count >= prefix.utf8CodeUnitCount else { return false }
        return prefix.withUTF8Buffer { expected in
            expected.indices.allSatisfy { bytes[$0] | 0x20 == expected[$0] | 0x20 }
        }
    }

    /// Decimal digits only, 1–65535.
    private static func port(_ bytes: UnsafeBufferPointer<UInt8>, _ from: Int, _ to: Int) -> Int? {
        guard from < to, to - from <= 5 else { return nil }
        var value = 0
        for index in from..<to {
            let digit = bytes[index] &- UInt8(ascii: "0")
            guard digit < 10 else { return nil }
            value = value * 10 + Int(digit)
        }
        return (1...65535).contains(value) ? value : nil
    }

    /// A space or a line break (`Character.isNewline`: LF, VT, FF, CR, NEL, LS, PS).
    private static func containsSpaceOrNewline(_ host: UnsafeBufferPointer<UInt8>) -> Bool {
        for (index, byte) in host.enumerated() {
            switch byte {
            case 0x20, 0x0A...0x0D: return true
            case 0xC2 where index + 1 < host.count && host[index + 1] == 0x85: return true
            case 0xE2 where index + 2 < host.count && host[index + 1] == 0x80:
                if host[index + 2] == 0xA8 || host[index + 2] == 0xA9 { return true }
            default: continue
            }
        }
        return false
    }
}
