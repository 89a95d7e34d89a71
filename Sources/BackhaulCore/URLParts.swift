/// The parts of an http(s) URL that policy and limits need.
public struct URLParts: Sendable, Equatable {
    public var scheme: String
    public var host: String
    public var port: Int

    /// Parses `scheme://[userinfo@]host[:port][/...]`; nil for anything else.
    public init?(_ url: String) {
        let lower = url.lowercased()
        let scheme: String
        if lower.hasPrefix("http://") {
            scheme = "http"
        } else if lower.hasPrefix("https://") {
            scheme = "https"
        } else {
            return nil
        }
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
