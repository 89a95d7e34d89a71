/// Task counts by state, as sessions and `/v1/info` give them; states this client does not know
/// are left out.
public struct TaskCounts: Sendable, Equatable, Codable {
    public var byState: [TaskState: Int]

    public init(_ byState: [TaskState: Int] = [:]) { self.byState = byState }

    public init(from decoder: any Decoder) throws {
        var counts: [TaskState: Int] = [:]
        for (name, count) in try decoder.singleValueContainer().decode([String: Int].self) {
            if let state = TaskState(rawValue: name) { counts[state] = count }
        }
        byState = counts
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(Dictionary(uniqueKeysWithValues: byState.map { ($0.key.rawValue, $0.value) }))
    }

    /// The count of one state (nil when the daemon did not give it).
    public subscript(state: TaskState) -> Int? { byState[state] }
}

/// A session with its task counts (OpenAPI/backhaul.yaml, `Session`).
public struct APISession: Sendable, Equatable, Codable {
    public var id: String
    public var configuration: SessionConfiguration?
    public var enabled: Bool
    /// `active`, or `finishing` after a `DELETE` with `mode=finish`.
    public var state: String?
    public var createdAt: String?
    public var taskCounts: TaskCounts

    enum CodingKeys: String, CodingKey {
        case id, configuration, enabled, state
        case createdAt = "created_at"
        case taskCounts = "task_counts"
    }
}

/// How a transfer shares the link (`network_service_type`).
public enum NetworkServiceType: String, Sendable, Equatable, Codable {
    case `default`
    case background
}

/// A session's or a task's configuration (OpenAPI/backhaul.yaml, `Configuration` as answered and
/// `ConfigurationInput` as sent): a member left nil is not sent, and keeps the daemon's value.
public struct SessionConfiguration: Sendable, Equatable, Codable {
    public var allowsCellularAccess: Bool?
    public var allowsExpensiveNetworkAccess: Bool?
    public var allowsConstrainedNetworkAccess: Bool?
    public var allowsRoaming: Bool?
    public var discretionary: Bool?
    /// `default` or `background` (paced by the path's queueing delay: yields to other flows).
    public var networkServiceType: NetworkServiceType?
    public var waitsForConnectivity: Bool?
    /// Seconds with no bytes moving before an attempt is abandoned (then retried).
    public var timeoutIntervalForRequest: Double?
    /// Seconds a task may live from creation before it fails `timed_out`.
    public var timeoutIntervalForResource: Double?
    public var maxConnectionsPerHost: Int?
    public var retry: Retry?
    public var defaultHeaders: [String: String]?
    /// Session only: the most bytes the session's unfinished tasks may hold.
    public var quotaBytes: Int64?
    /// Session only: seconds finished tasks are kept.
    public var finishedTaskRetention: Double?

    public init(
        allowsCellularAccess: Bool? = nil, allowsExpensiveNetworkAccess: Bool? = nil,
        allowsConstrainedNetworkAccess: Bool? = nil, allowsRoaming: Bool? = nil, discretionary: Bool? = nil,
        waitsForConnectivity: Bool? = nil, timeoutIntervalForRequest: Double? = nil, timeoutIntervalForResource: Double? = nil,
        maxConnectionsPerHost: Int? = nil, retry: Retry? = nil, defaultHeaders: [String: String]? = nil,
        quotaBytes: Int64? = nil, finishedTaskRetention: Double? = nil, networkServiceType: NetworkServiceType? = nil
    ) {
        self.networkServiceType = networkServiceType
        self.allowsCellularAccess = allowsCellularAccess
        self.allowsExpensiveNetworkAccess = allowsExpensiveNetworkAccess
        self.allowsConstrainedNetworkAccess = allowsConstrainedNetworkAccess
        self.allowsRoaming = allowsRoaming
        self.discretionary = discretionary
        self.waitsForConnectivity = waitsForConnectivity
        self.timeoutIntervalForRequest = timeoutIntervalForRequest
        self.timeoutIntervalForResource = timeoutIntervalForResource
        self.maxConnectionsPerHost = maxConnectionsPerHost
        self.retry = retry
        self.defaultHeaders = defaultHeaders
        self.quotaBytes = quotaBytes
        self.finishedTaskRetention = finishedTaskRetention
    }

    /// Retries of transient errors.
    public struct Retry: Sendable, Equatable, Codable {
        /// Nil: retry until the resource timeout.
        public var maxAttempts: Int?
        public var initialBackoff: Double?
        public var maxBackoff: Double?

        public init(maxAttempts: Int? = nil, initialBackoff: Double? = nil, maxBackoff: Double? = nil) {
            self.maxAttempts = maxAttempts
            self.initialBackoff = initialBackoff
            self.maxBackoff = maxBackoff
        }

        enum CodingKeys: String, CodingKey {
            case maxAttempts = "max_attempts"
            case initialBackoff = "initial_backoff"
            case maxBackoff = "max_backoff"
        }
    }

    enum CodingKeys: String, CodingKey {
        case discretionary, retry
        case allowsCellularAccess = "allows_cellular_access"
        case allowsExpensiveNetworkAccess = "allows_expensive_network_access"
        case allowsConstrainedNetworkAccess = "allows_constrained_network_access"
        case allowsRoaming = "allows_roaming"
        case networkServiceType = "network_service_type"
        case waitsForConnectivity = "waits_for_connectivity"
        case timeoutIntervalForRequest = "timeout_interval_for_request"
        case timeoutIntervalForResource = "timeout_interval_for_resource"
        case maxConnectionsPerHost = "max_connections_per_host"
        case defaultHeaders = "default_headers"
        case quotaBytes = "quota_bytes"
        case finishedTaskRetention = "finished_task_retention"
    }
}

/// The network the policy sees (`/v1/network`; OpenAPI/backhaul.yaml, `Network`).
public struct APINetwork: Sendable, Equatable, Codable {
    /// `wired`, `wifi`, `cellular`, `other` or `none`.
    public var type: String
    public var interface: String?
    public var expensive: Bool
    public var constrained: Bool
    /// A cellular network away from home (nil from a daemon that does not say).
    public var roaming: Bool?
    /// `full`, `limited`, `portal`, `none` or `unknown` (nil from a daemon that does not say).
    public var connectivity: String?
    /// `override`, `networkmanager` or `routing_table`.
    public var source: String
}

/// A daemon of the fleet sharing the state (`GET /v1/nodes`; one daemon on SQLite lists itself).
public struct APINode: Sendable, Equatable, Codable {
    public var id: String
    public var version: String
    public var startedAt: String
    /// When its last heartbeat reached the database.
    public var lastHeartbeatAt: String
    /// Transfers it runs.
    public var running: Int
    /// Its own network, if it said.
    public var network: APINetwork?

    enum CodingKeys: String, CodingKey {
        case id, version, running, network
        case startedAt = "started_at"
        case lastHeartbeatAt = "last_heartbeat_at"
    }
}

/// `GET /v1/nodes`'s answer.
public struct APINodeList: Sendable, Equatable, Codable {
    public var nodes: [APINode]
}

/// What `PUT /v1/network` sets; a member left nil is the daemon's rule for the type.
public struct NetworkOverride: Sendable, Equatable, Codable {
    public var type: String
    public var interface: String?
    public var expensive: Bool?
    public var constrained: Bool?
    public var roaming: Bool?
    public var connectivity: String?

    public init(
        type: String, interface: String? = nil, expensive: Bool? = nil, constrained: Bool? = nil, roaming: Bool? = nil,
        connectivity: String? = nil
    ) {
        self.type = type
        self.interface = interface
        self.expensive = expensive
        self.constrained = constrained
        self.roaming = roaming
        self.connectivity = connectivity
    }
}

/// A webhook subscription (OpenAPI/backhaul.yaml, `Webhook`); `secret` only in the answer that
/// created it or rotated it.
public struct APIWebhook: Sendable, Equatable, Codable {
    public var id: String
    public var sessionID: String?
    public var url: String
    public var events: [String]?
    public var enabled: Bool
    public var disabledReason: String?
    public var createdAt: String?
    public var secret: String?

    enum CodingKeys: String, CodingKey {
        case id, url, events, enabled, secret
        case sessionID = "session_id"
        case disabledReason = "disabled_reason"
        case createdAt = "created_at"
    }
}

/// `GET /v1/info`: the daemon's version, its protocols, its task counts, and its effective
/// configuration (every other member, already without secrets) in `settings`.
public struct APIInfo: Sendable, Equatable, Decodable {
    public var version: String
    public var protocols: [String]
    public var taskCounts: TaskCounts
    /// The configuration members by name (`listen`, `state_dir`, `max_transfers`, …).
    public var settings: [String: APIValue]

    private struct Key: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: Key.self)
        version = try container.decode(String.self, forKey: Key(stringValue: "version"))
        protocols = try container.decode([String].self, forKey: Key(stringValue: "protocols"))
        taskCounts = try container.decode(TaskCounts.self, forKey: Key(stringValue: "task_counts"))
        var settings: [String: APIValue] = [:]
        for key in container.allKeys where !["version", "protocols", "task_counts"].contains(key.stringValue) {
            settings[key.stringValue] = try container.decode(APIValue.self, forKey: key)
        }
        self.settings = settings
    }
}

/// One attempt of `GET /v1/tasks/{id}/attempts` (OpenAPI/backhaul.yaml, `Attempt`).
public struct APIAttempt: Sendable, Equatable, Codable {
    /// The attempt's place in the task's history, from 1.
    public var number: Int
    public var startedAt: String
    public var endedAt: String?
    public var bytesSent: Int64
    public var bytesReceived: Int64
    /// `completed`, `retry`, `failed` or `stopped`.
    public var outcome: String
    public var httpStatus: Int?
    public var error: TaskFailure?
    public var networkType: String?

    enum CodingKeys: String, CodingKey {
        case number, outcome, error
        case startedAt = "started_at"
        case endedAt = "ended_at"
        case bytesSent = "bytes_sent"
        case bytesReceived = "bytes_received"
        case httpStatus = "http_status"
        case networkType = "network_type"
    }
}

/// One page of `GET /v1/sessions/{id}/tasks`.
public struct TaskPage: Sendable, Equatable, Codable {
    public var tasks: [APITask]
    /// Nil on the last page.
    public var nextCursor: String?

    enum CodingKeys: String, CodingKey {
        case tasks
        case nextCursor = "next_cursor"
    }
}

/// What `POST /v1/admin/backup` wrote.
public struct BackupResult: Sendable, Equatable, Codable {
    public var path: String
    public var bytes: Int64
    public var seconds: Double
}

/// One event of `GET /v1/events` (OpenAPI/backhaul.yaml, `EventType`): a `task.*` event carries
/// the task as it was then, `session.drained` the session's counts.
public struct APIEvent: Sendable, Equatable {
    /// The event's sequence number, to resume after (`Last-Event-ID`).
    public var id: String?
    /// `task.completed`, `task.failed`, `task.cancelled`, `task.waiting`, `task.auth_required`,
    /// `task.progress`, `session.drained`.
    public var type: String
    public var timestamp: String?
    public var task: APITask?
    public var drained: SessionDrained?

    public init(id: String?, type: String, timestamp: String? = nil, task: APITask? = nil, drained: SessionDrained? = nil) {
        self.id = id
        self.type = type
        self.timestamp = timestamp
        self.task = task
        self.drained = drained
    }

    /// `session.drained`: every task of the session has reached a final state.
    public struct SessionDrained: Sendable, Equatable, Codable {
        public var sessionID: String
        public var taskCounts: TaskCounts

        enum CodingKeys: String, CodingKey {
            case sessionID = "session_id"
            case taskCounts = "task_counts"
        }
    }
}
