import Glibc

/// Where uploads and webhooks may go (OpenAPI/backhaul.yaml): optional host allow-lists and a switch against
/// private addresses (SSRF). Patterns are shell globs on the host (`*.example.com`), optionally
/// with a scheme (`https://*.example.com`); an empty list allows every host.
public struct DestinationRules: Sendable, Equatable {
    public var uploadHosts: [String] = []
    public var webhookHosts: [String] = []
    /// Refuse loopback, private, link-local and other non-public addresses: IP literals at once,
    /// names once they resolve (checked on the connected peer address, so DNS rebinding does not
    /// get through).
    public var denyPrivate = false

    public init() {}

    public enum Purpose: String, Sendable { case upload, webhook }

    /// Why the URL may not be used, or nil when it may.
    public func refusal(_ url: String, for purpose: Purpose) -> String? {
        guard let parts = URLParts(url) else { return "is not an absolute http or https URL" }
        if let refusal = allowListRefusal(parts, for: purpose) { return refusal }
        if denyPrivate, Self.isPrivate(address: Self.bareHost(parts)) {
            return "\(Self.bareHost(parts)) is a private address and private destinations are denied"
        }
        return nil
    }

    /// Why the allow-list for `purpose` does not admit the URL's host, or nil when it does (or is
    /// not set).
    public func allowListRefusal(_ url: String, for purpose: Purpose) -> String? {
        guard let parts = URLParts(url) else { return "is not an absolute http or https URL" }
        return allowListRefusal(parts, for: purpose)
    }

    private func allowListRefusal(_ parts: URLParts, for purpose: Purpose) -> String? {
        let host = Self.bareHost(parts)
        let patterns = purpose == .upload ? uploadHosts : webhookHosts
        guard patterns.isEmpty || patterns.contains(where: { Self.matches($0, scheme: parts.scheme, host: host) }) else {
            return "\(parts.scheme)://\(host) is not in the allowed \(purpose.rawValue) hosts"
        }
        return nil
    }

    /// The host without the brackets of an IPv6 literal.
    private static func bareHost(_ parts: URLParts) -> String {
        parts.host.hasPrefix("[") ? String(parts.host.dropFirst().dropLast()) : parts.host
    }

    /// Whether a task whose own URL is `taskURL` may send a request, with its headers, to `url`
    /// (docs/credentials.md): a server-given URL (a tus or IETF `Location`) on another origin needs the
    /// upload allow-list's admission when the list is set. The task's own origin passed it at
    /// enqueue; private addresses are refused when connecting, for every request alike. Nil when
    /// it may; else the task's error, `-1011` with `location_host_not_allowed`.
    public func locationRefusal(_ url: String, taskURL: String) -> TaskError? {
        guard !uploadHosts.isEmpty else { return nil }
        let parts = URLParts(url)
        if let parts, parts.hostKey == URLParts(taskURL)?.hostKey || allowListRefusal(parts, for: .upload) == nil {
            return nil
        }
        let shown = parts.map { "\($0.scheme)://\($0.host):\($0.port)" } ?? "a URL that is not absolute http(s)"
        return TaskError(
            .badServerResponse, message: "the server named \(shown), which is not in the allowed upload hosts",
            reason: .locationHostNotAllowed)
    }

    static func matches(_ pattern: String, scheme: String, host: String) -> Bool {
        let lower = pattern.lowercased()
        if let range = lower.firstRange(of: "://") {
            return String(lower[..<range.lowerBound]) == scheme && Glob.matches(String(lower[range.upperBound...]), host)
        }
        return Glob.matches(lower, host)
    }

    /// Whether an IP address (v4 or v6, as text) is not a public unicast one. Names are not
    /// addresses: false.
    public static func isPrivate(address: String) -> Bool {
        var v4 = in_addr()
        if inet_pton(AF_INET, address, &v4) == 1 { return isPrivate(v4: UInt32(bigEndian: v4.s_addr)) }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, address, &v6) == 1 else { return false }
        let bytes = withUnsafeBytes(of: v6) { Array($0) }
        if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF {
            // IPv4-mapped
            return isPrivate(v4: UInt32(bytes[12]) << 24 | UInt32(bytes[13]) << 16 | UInt32(bytes[14]) << 8 | UInt32(bytes[15]))
        }
        if bytes[0..<15].allSatisfy({ $0 == 0 }) { return true }  // :: and ::1
        if bytes[0] & 0xFE == 0xFC { return true }  // fc00::/7 unique local
        if bytes[0] == 0xFE && bytes[1] & 0xC0 == 0x80 { return true }  // fe80::/10 link-local
        return false
    }

    static func isPrivate(v4 address: UInt32) -> Bool {
        func inside(_ network: UInt32, _ bits: UInt32) -> Bool { address >> (32 - bits) == network >> (32 - bits) }
        return inside(0x0000_0000, 8) || inside(0x0A00_0000, 8) || inside(0x7F00_0000, 8) || inside(0xA9FE_0000, 16)
            || inside(0xAC10_0000, 12) || inside(0xC0A8_0000, 16) || inside(0x6440_0000, 10) || inside(0xE000_0000, 4)
            || address == 0xFFFF_FFFF
    }
}
