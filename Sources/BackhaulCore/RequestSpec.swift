import JSONValue

/// The request a task makes (OpenAPI/backhaul.yaml `request`), headers unredacted.
public struct RequestSpec: Sendable, Equatable {
    public var url: String { didSet { hostKey = Self.hostKey(of: url) } }
    public var method: String
    public var headers: [(String, String)]
    /// The URL's scheme://host:port, the key of per-host connection limits. Kept with the URL:
    /// the store, its change feed, the scheduler and the API ask for it a dozen times a task, and
    /// working it out each time cost 4,400 instructions a task.
    public private(set) var hostKey: String

    public init(url: String, method: String, headers: [(String, String)] = []) {
        self.url = url
        self.method = method
        self.headers = headers
        hostKey = Self.hostKey(of: url)
    }

    private static func hostKey(of url: String) -> String { URLParts(url)?.hostKey ?? url }

    public static func == (lhs: RequestSpec, rhs: RequestSpec) -> Bool {
        lhs.url == rhs.url && lhs.method == rhs.method && HeaderRules.sameSet(lhs.headers, rhs.headers)
    }

    /// `{"url", "method", "headers"}`; `redacted` hides secret header values (what is shown).
    public func writeJSON(to writer: inout JSONWriter, redacted: Bool) {
        writer.object { object in
            object.key("url")
            object.string(url)
            object.key("method")
            object.string(method)
            object.key("headers")
            object.value(HeaderRules.json(headers, redacted: redacted))
        }
    }
}
