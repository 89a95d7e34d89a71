/// A task as the API shows it (OpenAPI/backhaul.yaml, `Task`). Times are RFC 3339 strings, as
/// sent.
public struct APITask: Sendable, Equatable, Codable {
    public var id: String
    public var sessionID: String
    /// With the state in PostgreSQL: the node of the fleet the task is pinned to (its file is on
    /// that node's own disk); nil when any node may run it.
    public var node: String?
    public var kind: TaskKind
    public var state: TaskState
    /// Why a `waiting` (or `queued`) task is held (`session_disabled`, `cellular_not_allowed`, …).
    public var waitingReason: String?
    /// Only in `auth_required`: why (`credentials_expired`, `unauthorized`).
    public var auth: Auth?
    /// The file an upload reads (nil for a download).
    public var file: FileInfo?
    /// Where a download goes (nil for an upload).
    public var download: DownloadTarget?
    public var request: RequestInfo
    /// The upload protocol as given, with what the server told (nil for a download).
    public var upload: UploadInfo?
    public var priority: Double?
    public var description: String?
    public var idempotencyKey: String?
    public var deleteFileOnSuccess: Bool?
    /// The task's own configuration overrides, secrets redacted.
    public var configuration: APIValue?
    /// Attempts counted against the retry limit.
    public var attempts: Int
    public var progress: TaskProgress
    public var createdAt: String
    public var startedAt: String?
    public var finishedAt: String?
    public var nextAttemptAt: String?
    public var earliestBeginAt: String?
    /// The last response's status, headers and up to 64 KiB of body.
    public var response: ResponseInfo?
    /// Why the task ended failed or cancelled.
    public var error: TaskFailure?
    /// The latest failed attempt's error, kept while the task goes on.
    public var lastError: TaskFailure?
    public var cancellation: Cancellation?

    enum CodingKeys: String, CodingKey {
        case id, node, kind, state, auth, file, download, request, upload, priority, description, configuration, attempts
        case progress
        case response, error, cancellation
        case sessionID = "session_id"
        case waitingReason = "waiting_reason"
        case idempotencyKey = "idempotency_key"
        case deleteFileOnSuccess = "delete_file_on_success"
        case createdAt = "created_at"
        case startedAt = "started_at"
        case finishedAt = "finished_at"
        case nextAttemptAt = "next_attempt_at"
        case earliestBeginAt = "earliest_begin_at"
        case lastError = "last_error"
    }

    /// The URL the task sends to or fetches from.
    public var url: String { request.url }
    /// An upload's protocol (`raw`, `chunked`, …).
    public var uploadProtocol: String? { upload?.protocol }
    /// Where a download goes.
    public var destination: String? { download?.destination }
    /// The local file: what an upload reads, or where a download goes.
    public var localPath: String? { file?.path ?? download?.destination }
    /// The final response's status.
    public var responseStatus: Int? { response?.status }

    public struct Auth: Sendable, Equatable, Codable {
        public var reason: String
    }

    /// The uploaded file as recorded at creation.
    public struct FileInfo: Sendable, Equatable, Codable {
        public var path: String
        public var size: Int64?
        public var modifiedAt: String?

        enum CodingKeys: String, CodingKey {
            case path, size
            case modifiedAt = "modified_at"
        }
    }

    /// A download's destination.
    public struct DownloadTarget: Sendable, Equatable, Codable {
        public var destination: String
        public var overwrite: Bool?
        public var expectedSHA256: String?

        enum CodingKeys: String, CodingKey {
            case destination, overwrite
            case expectedSHA256 = "expected_sha256"
        }
    }

    public struct RequestInfo: Sendable, Equatable, Codable {
        public var url: String
        public var method: String?
        public var headers: [String: String]?
    }

    /// `upload`: the protocol and its options, and for `auto` and `ietf` what was settled.
    public struct UploadInfo: Sendable, Equatable, Codable {
        public var `protocol`: String
        public var chunkSize: Int64?
        public var contentType: String?
        /// `auto`: the protocol picked (`ietf`, `tus`, `raw`), nil until the server answered.
        public var protocolSelected: String?
        /// `ietf` (or `auto` having picked it): the draft version spoken, nil until settled.
        public var interopVersionSelected: Int?

        enum CodingKeys: String, CodingKey {
            case `protocol`
            case chunkSize = "chunk_size"
            case contentType = "content_type"
            case protocolSelected = "protocol_selected"
            case interopVersionSelected = "interop_version_selected"
        }
    }

    /// The last response of the task's server.
    public struct ResponseInfo: Sendable, Equatable, Codable {
        public var status: Int
        public var headers: [String: String]?
        /// UTF-8 text, or base64 when `bodyEncoding` is `base64`.
        public var body: String?
        public var bodyEncoding: String?

        enum CodingKeys: String, CodingKey {
            case status, headers, body
            case bodyEncoding = "body_encoding"
        }
    }

    /// Why a task was cancelled: 0 `user_cancelled`, 1 `background_updates_disabled`, 2
    /// `insufficient_system_resources`.
    public struct Cancellation: Sendable, Equatable, Codable {
        public var reasonCode: Int
        public var reason: String

        enum CodingKeys: String, CodingKey {
            case reason
            case reasonCode = "reason_code"
        }
    }
}

public enum TaskKind: String, Sendable, Codable, CaseIterable {
    case upload, download
}

/// A task's state (OpenAPI/backhaul.yaml, `TaskState`).
public enum TaskState: String, Sendable, Codable, CaseIterable {
    case queued, waiting, running, retrying, suspended
    case authRequired = "auth_required"
    case completed, failed, cancelled

    /// Completed, failed or cancelled: the task will not change again.
    public var isFinal: Bool { self == .completed || self == .failed || self == .cancelled }

    /// The states a task may still leave.
    public static let unfinished = allCases.filter { !$0.isFinal }
}

/// A task's `progress`: one of `bytesSent` (uploads) and `bytesReceived` (downloads) moves.
public struct TaskProgress: Sendable, Equatable, Codable {
    public var bytesSent: Int64
    public var bytesReceived: Int64
    /// Nil while a download's size is unknown.
    public var bytesTotal: Int64?
    public var fraction: Double
    public var bytesPerSecond: Int64
    public var etaSeconds: Double?
    /// A running background transfer's pacing: it yields to other flows on its path.
    public var background: BackgroundPacing?

    /// The rate a background transfer paces at and the queueing delay it measures.
    public struct BackgroundPacing: Sendable, Equatable, Codable {
        public var rateBytesPerSecond: Int64
        public var queueDelayMilliseconds: Double

        public init(rateBytesPerSecond: Int64, queueDelayMilliseconds: Double) {
            self.rateBytesPerSecond = rateBytesPerSecond
            self.queueDelayMilliseconds = queueDelayMilliseconds
        }

        enum CodingKeys: String, CodingKey {
            case rateBytesPerSecond = "rate_bytes_per_second"
            case queueDelayMilliseconds = "queue_delay_ms"
        }
    }

    public init(
        bytesSent: Int64 = 0, bytesReceived: Int64 = 0, bytesTotal: Int64?, fraction: Double, bytesPerSecond: Int64 = 0,
        etaSeconds: Double? = nil, background: BackgroundPacing? = nil
    ) {
        self.background = background
        self.bytesSent = bytesSent
        self.bytesReceived = bytesReceived
        self.bytesTotal = bytesTotal
        self.fraction = fraction
        self.bytesPerSecond = bytesPerSecond
        self.etaSeconds = etaSeconds
    }

    enum CodingKeys: String, CodingKey {
        case fraction
        case bytesSent = "bytes_sent"
        case bytesReceived = "bytes_received"
        case bytesTotal = "bytes_total"
        case bytesPerSecond = "bytes_per_second"
        case etaSeconds = "eta_seconds"
        case background
    }

    /// Bytes moved either way (a task counts only one of them).
    public var moved: Int64 { bytesSent + bytesReceived }
}

/// A task error (OpenAPI/backhaul.yaml, `TaskError`): code, name, message, the HTTP status when
/// one caused it, and for `last_error` when it happened.
public struct TaskFailure: Sendable, Equatable, Codable {
    public var code: Int
    public var name: String
    public var message: String?
    public var httpStatus: Int?
    /// `location_host_not_allowed`, `credentials_expired`, `unauthorized`, when there is one.
    public var reason: String?
    /// `last_error` only.
    public var at: String?

    enum CodingKeys: String, CodingKey {
        case code, name, message, reason, at
        case httpStatus = "http_status"
    }
}
