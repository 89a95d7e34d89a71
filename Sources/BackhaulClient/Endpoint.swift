/// Every API address the client uses, built here and only here: each path segment and query
/// value is percent-encoded, so an id or a cursor can never reach another route.
public struct Endpoint: Sendable, Equatable, CustomStringConvertible {
    public var segments: [String]
    public var query: [(name: String, value: String)]

    public var description: String { pathAndQuery }

    init(_ segments: String..., query: [(String, String?)] = []) {
        self.segments = segments
        self.query = query.compactMap { name, value in value.map { (name, $0) } }
    }

    public static let info = Endpoint("v1", "info")
    public static let sessions = Endpoint("v1", "sessions")
    public static func session(_ id: String) -> Endpoint { Endpoint("v1", "sessions", id) }
    /// One page of a session's tasks, oldest first.
    public static func tasks(session: String, state: String?, limit: Int, cursor: String?) -> Endpoint {
        Endpoint("v1", "sessions", session, "tasks", query: [("limit", String(limit)), ("state", state), ("cursor", cursor)])
    }
    public static func tasks(session: String) -> Endpoint { Endpoint("v1", "sessions", session, "tasks") }
    public static func task(_ id: String) -> Endpoint { Endpoint("v1", "tasks", id) }
    public static func attempts(task id: String) -> Endpoint { Endpoint("v1", "tasks", id, "attempts") }
    public static func command(_ command: TaskCommand, task id: String) -> Endpoint {
        Endpoint("v1", "tasks", id, command.rawValue)
    }
    /// `DELETE /v1/sessions/{id}?mode=`.
    public static func session(_ id: String, mode: SessionEnd) -> Endpoint {
        Endpoint("v1", "sessions", id, query: [("mode", mode.rawValue)])
    }
    public static let network = Endpoint("v1", "network")
    public static let nodes = Endpoint("v1", "nodes")
    public static let policy = Endpoint("v1", "policy")
    public static let backup = Endpoint("v1", "admin", "backup")
    public static func webhooks(session: String) -> Endpoint { Endpoint("v1", "sessions", session, "webhooks") }
    public static func webhook(_ id: String) -> Endpoint { Endpoint("v1", "webhooks", id) }
    public static func events(session: String?, after: String? = nil) -> Endpoint {
        Endpoint("v1", "events", query: [("session", session), ("after", after)])
    }

    /// `/v1/…?name=value&…`, encoded.
    public var pathAndQuery: String {
        let path = "/" + segments.map(Self.encodedSegment).joined(separator: "/")
        guard !query.isEmpty else { return path }
        return path + "?" + query.map { Self.encoded($0.name) + "=" + Self.encoded($0.value) }.joined(separator: "&")
    }

    public static func == (lhs: Endpoint, rhs: Endpoint) -> Bool { lhs.pathAndQuery == rhs.pathAndQuery }

    /// A path segment: percent-encoded, and a segment of dots encoded whole, since `.` and `..`
    /// would otherwise be removed or climb a level (RFC 3986 §5.2.4) before the daemon saw them.
    static func encodedSegment(_ text: String) -> String {
        guard !text.isEmpty, text.utf8.allSatisfy({ $0 == UInt8(ascii: ".") }) else { return encoded(text) }
        return String(repeating: "%2E", count: text.utf8.count)
    }

    /// Everything but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`) as `%XX` of its UTF-8.
    static func encoded(_ text: String) -> String {
        var result = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                result.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                let digits = Array("0123456789ABCDEF".utf8)
                result += "%" + String(decoding: [digits[Int(byte >> 4)], digits[Int(byte & 0xF)]], as: UTF8.self)
            }
        }
        return result
    }
}
