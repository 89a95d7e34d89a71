/// A task handed over by `POST /v1/sessions/{id}/tasks` (OpenAPI/backhaul.yaml, `TaskInput`).
/// `upload(…)` and `download(…)` make the common ones; the other members are the API's options.
public struct NewTask: Sendable, Equatable, Encodable {
    /// Nil: an upload.
    public var kind: TaskKind?
    /// An upload's file (absolute, inside the daemon's allowed roots).
    public var file: String?
    /// A download's destination (absolute).
    public var destination: String?
    public var overwrite: Bool?
    public var expectedSHA256: String?
    public var request: Request
    public var upload: Upload?
    public var priority: Double?
    /// RFC 3339: not before then.
    public var earliestBeginAt: String?
    public var description: String?
    /// A second create with the same key in the same session returns the first task.
    public var idempotencyKey: String?
    public var deleteFileOnSuccess: Bool?
    public var configuration: SessionConfiguration?

    public init(kind: TaskKind? = nil, request: Request) {
        self.kind = kind
        self.request = request
    }

    /// `file` (absolute) sent to `url` with `protocol` (`raw`, `multipart`, `chunked`, `tus`, `s3`,
    /// `ietf`, `auto`); `interopVersion` pins the IETF draft's version.
    public static func upload(
        file: String, url: String, method: String? = nil, headers: [(String, String)] = [], protocol: String = "raw",
        chunkSize: Int? = nil, interopVersion: Int? = nil
    ) -> NewTask {
        var task = NewTask(request: Request(url: url, method: method, headers: headers))
        task.file = file
        task.upload = Upload(protocol: `protocol`, chunkSize: chunkSize.map(Int64.init), interopVersion: interopVersion)
        return task
    }

    /// `url` fetched into `destination` (absolute), checked against `sha256` when given.
    public static func download(
        url: String, destination: String, headers: [(String, String)] = [], overwrite: Bool = false, sha256: String? = nil
    ) -> NewTask {
        var task = NewTask(kind: .download, request: Request(url: url, headers: headers))
        task.destination = destination
        task.overwrite = overwrite ? true : nil
        task.expectedSHA256 = sha256
        return task
    }

    public struct Request: Sendable, Equatable, Encodable {
        public var url: String
        /// Nil: PUT for an upload, GET for a download.
        public var method: String?
        public var headers: [String: String]?

        public init(url: String, method: String? = nil, headers: [(String, String)] = []) {
            self.url = url
            self.method = method
            self.headers = headers.isEmpty ? nil : Dictionary(headers, uniquingKeysWith: { $1 })
        }
    }

    /// The upload protocol and its options (OpenAPI/backhaul.yaml, `Upload`).
    public struct Upload: Sendable, Equatable, Encodable {
        public var `protocol`: String
        public var chunkSize: Int64?
        public var interopVersion: Int?
        public var contentType: String?
        /// `multipart`: the file part's name, its file name, and text fields sent before it.
        public var field: String?
        public var filename: String?
        public var fields: [String: String]?

        public init(protocol: String, chunkSize: Int64? = nil, interopVersion: Int? = nil, contentType: String? = nil) {
            self.protocol = `protocol`
            self.chunkSize = chunkSize
            self.interopVersion = interopVersion
            self.contentType = contentType
        }

        enum CodingKeys: String, CodingKey {
            case `protocol`, field, filename, fields
            case chunkSize = "chunk_size"
            case interopVersion = "interop_version"
            case contentType = "content_type"
        }
    }

    enum CodingKeys: String, CodingKey {
        case kind, file, destination, overwrite, request, upload, priority, description, configuration
        case expectedSHA256 = "expected_sha256"
        case earliestBeginAt = "earliest_begin_at"
        case idempotencyKey = "idempotency_key"
        case deleteFileOnSuccess = "delete_file_on_success"
    }
}

/// What `PATCH /v1/tasks/{id}` changes; a member left nil is left as it is.
public struct TaskPatch: Sendable, Equatable, Encodable {
    public var priority: Double?
    /// Merged over the task's headers; a nil value removes that header.
    public var headers: [String: String?]?
    /// Only while the task is not running.
    public var url: String?
    public var method: String?
    public var earliestBeginAt: String?
    public var configuration: SessionConfiguration?

    public init(
        priority: Double? = nil, headers: [String: String?]? = nil, url: String? = nil, method: String? = nil,
        earliestBeginAt: String? = nil, configuration: SessionConfiguration? = nil
    ) {
        self.priority = priority
        self.headers = headers
        self.url = url
        self.method = method
        self.earliestBeginAt = earliestBeginAt
        self.configuration = configuration
    }

    private struct RequestPatch: Encodable {
        var headers: [String: String?]?
        var url: String?
        var method: String?
    }

    enum CodingKeys: String, CodingKey {
        case priority, request, configuration
        case earliestBeginAt = "earliest_begin_at"
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encodeIfPresent(priority, forKey: .priority)
        if headers != nil || url != nil || method != nil {
            try container.encode(RequestPatch(headers: headers, url: url, method: method), forKey: .request)
        }
        try container.encodeIfPresent(earliestBeginAt, forKey: .earliestBeginAt)
        try container.encodeIfPresent(configuration, forKey: .configuration)
    }
}

/// What `PATCH /v1/sessions/{id}` changes: the configuration (merged), enabled, and with
/// `enabled: false`, `cancelPending` to cancel the unfinished tasks instead of holding them.
public struct SessionPatch: Sendable, Equatable, Encodable {
    public var configuration: SessionConfiguration?
    public var enabled: Bool?
    public var cancelPending: Bool?

    public init(configuration: SessionConfiguration? = nil, enabled: Bool? = nil, cancelPending: Bool? = nil) {
        self.configuration = configuration
        self.enabled = enabled
        self.cancelPending = cancelPending
    }

    enum CodingKeys: String, CodingKey {
        case configuration, enabled
        case cancelPending = "cancel_pending"
    }
}

/// How `DELETE /v1/sessions/{id}` ends a session: `finish` lets every accepted task run to its
/// end, `cancel` cancels the unfinished ones at once.
public enum SessionEnd: String, Sendable {
    case finish, cancel
}

/// The commands a task takes: `POST /v1/tasks/{id}/cancel`, `/suspend`, `/resume`.
public enum TaskCommand: String, Sendable, CaseIterable {
    case cancel, suspend, resume
}
