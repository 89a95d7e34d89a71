import BackhaulCore
import JSONCodec

/// Task counts by state, as sessions and `/v1/info` give them; states this client does not
/// know are left out.
func taskCounts(_ reader: AnswerReader, _ key: String) throws(APIError) -> [TaskState: Int] {
    var counts: [TaskState: Int] = [:]
    for (name, count) in try reader.counts(key) {
        if let state = TaskState(rawValue: name) { counts[state] = count }
    }
    return counts
}

/// A session with its task counts (OpenAPI/backhaul.yaml).
public struct APISession: Sendable {
    public var json: JSON
    public var id: String
    public var enabled: Bool
    public var taskCounts: [TaskState: Int]

    public init(json: JSON, at path: String = "") throws(APIError) {
        let reader = try AnswerReader(json, at: path)
        self.json = json
        id = try reader.string("id")
        enabled = try reader.bool("enabled")
        taskCounts = try BackhaulCLI.taskCounts(reader, "task_counts")
    }
}

/// The network the policy sees (`/v1/network`).
public struct APINetwork: Sendable {
    public var json: JSON
    /// `wired`, `wifi`, `cellular`, `other` or `none`.
    public var type: String
    public var interface: String?
    public var expensive: Bool
    public var constrained: Bool
    /// A cellular network away from home (false from a daemon that does not say).
    public var roaming: Bool
    /// `full`, `limited`, `portal`, `none` or `unknown` (nil from a daemon that does not say).
    public var connectivity: String?
    /// `override`, `networkmanager` or `routing_table`.
    public var source: String

    public init(json: JSON) throws(APIError) {
        let reader = try AnswerReader(json)
        self.json = json
        type = try reader.string("type")
        interface = try reader.optionalString("interface")
        expensive = try reader.bool("expensive")
        constrained = try reader.bool("constrained")
        roaming = json["roaming"] == nil ? false : try reader.bool("roaming")
        connectivity = try reader.optionalString("connectivity")
        source = try reader.string("source")
    }
}

/// What `PUT /v1/network` sets; a flag left nil is the daemon's rule for the type.
public struct NetworkOverride: Sendable, Equatable {
    public var type: String
    public var expensive: Bool?
    public var constrained: Bool?

    public init(type: String, expensive: Bool? = nil, constrained: Bool? = nil) {
        self.type = type
        self.expensive = expensive
        self.constrained = constrained
    }

    var json: JSON {
        var body: JSONObject = ["type": .string(type)]
        if let expensive { body["expensive"] = .bool(expensive) }
        if let constrained { body["constrained"] = .bool(constrained) }
        return .object(body)
    }
}

/// A webhook subscription; `secret` only in the answer that created it.
public struct APIWebhook: Sendable {
    public var json: JSON
    public var id: String
    public var url: String
    public var enabled: Bool
    public var secret: String?

    public init(json: JSON, at path: String = "") throws(APIError) {
        let reader = try AnswerReader(json, at: path)
        self.json = json
        id = try reader.string("id")
        url = try reader.string("url")
        enabled = try reader.bool("enabled")
        secret = try reader.optionalString("secret")
    }
}

/// `GET /v1/info`: the daemon's version, its protocols, its task counts and its effective
/// configuration (every other member, already without secrets).
public struct APIInfo: Sendable {
    public var json: JSON
    public var version: String
    public var protocols: [String]
    public var taskCounts: [TaskState: Int]

    public init(json: JSON) throws(APIError) {
        let reader = try AnswerReader(json)
        self.json = json
        version = try reader.string("version")
        protocols = try reader.array("protocols") { (item, path) throws(APIError) in
            guard let name = item.stringValue else { throw .unexpectedAnswer("\(path) is \(item.typeName), not a string") }
            return name
        }
        taskCounts = try BackhaulCLI.taskCounts(reader, "task_counts")
    }

    /// The configuration members, in the daemon's order.
    public var settings: [(name: String, value: JSON)] {
        (json.objectValue ?? [:]).entries.filter { !["version", "protocols", "task_counts"].contains($0.key) }.map {
            ($0.key, $0.value)
        }
    }
}

/// One event of `GET /v1/events`; a `task.*` event carries the task as it was then.
public struct APIEvent: Sendable {
    public var id: String?
    public var type: String
    public var task: APITask?

    /// The event stream's framing done, this reads the envelope (`{"type", "data", …}`); a task
    /// event whose task cannot be read still counts as an event, without its task.
    public init(_ event: ServerSentEvent) {
        id = event.id
        type = event.type
        task =
            type.hasPrefix("task.")
            ? (try? JSON.parse(event.data, maxDepth: 64))?["data"].flatMap { try? APITask(json: $0) } : nil
    }
}

/// A task handed over by `POST /v1/sessions/{id}/tasks`.
public enum NewTask: Sendable, Equatable {
    /// `file` (absolute) sent to `url` with `protocol` (`raw`, `multipart`, `chunked`, `tus`, `s3`,
    /// `ietf`, `auto`); `interopVersion` pins the IETF draft's version.
    case upload(
        file: String, url: String, method: String?, headers: [(String, String)], protocol: String, chunkSize: Int?,
        interopVersion: Int? = nil)
    /// `url` fetched into `destination` (absolute), checked against `sha256` when given.
    case download(url: String, destination: String, headers: [(String, String)], overwrite: Bool, sha256: String?)

    var json: JSON {
        switch self {
        case .upload(let file, let url, let method, let headers, let protocolName, let chunkSize, let interopVersion):
            var upload: JSONObject = ["protocol": .string(protocolName)]
            if let chunkSize { upload["chunk_size"] = .int(Int64(chunkSize)) }
            if let interopVersion { upload["interop_version"] = .int(Int64(interopVersion)) }
            return ["file": .string(file), "request": Self.request(url, method, headers), "upload": .object(upload)]
        case .download(let url, let destination, let headers, let overwrite, let sha256):
            var task: JSONObject = [
                "kind": "download", "request": Self.request(url, nil, headers), "destination": .string(destination),
            ]
            if overwrite { task["overwrite"] = true }
            if let sha256 { task["expected_sha256"] = .string(sha256) }
            return .object(task)
        }
    }

    private static func request(_ url: String, _ method: String?, _ headers: [(String, String)]) -> JSON {
        var request: JSONObject = ["url": .string(url)]
        if let method { request["method"] = .string(method) }
        var object = JSONObject()
        for (name, value) in headers { object[name] = .string(value) }
        if !object.isEmpty { request["headers"] = .object(object) }
        return .object(request)
    }

    public static func == (lhs: NewTask, rhs: NewTask) -> Bool { lhs.json == rhs.json }
}
