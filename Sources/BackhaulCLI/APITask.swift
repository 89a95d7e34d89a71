import BackhaulCore
import JSONCodec

/// A task as `GET /v1/tasks/{id}` shows it (OpenAPI/backhaul.yaml): what the command line reads of it, and
/// the object itself, which `--json` prints as it came.
public struct APITask: Sendable {
    public enum Kind: String, Sendable { case upload, download }

    /// The object as the API sent it.
    public var json: JSON
    public var id: String
    public var sessionID: String
    public var kind: Kind
    public var state: TaskState
    public var waitingReason: String?
    /// The file an upload reads.
    public var file: String?
    /// Where a download goes.
    public var destination: String?
    public var url: String
    /// An upload's protocol (`raw`, `chunked`, …).
    public var uploadProtocol: String?
    public var progress: TaskProgress
    public var attempts: Int
    /// Why the task ended failed or cancelled.
    public var error: TaskFailure?
    /// The latest failed attempt's error, kept while the task goes on.
    public var lastError: TaskFailure?
    public var nextAttemptAt: String?
    /// The final response's status.
    public var responseStatus: Int?
    public var createdAt: String

    /// The local file: what an upload reads, or where a download goes.
    public var localPath: String? { file ?? destination }

    public init(json: JSON, at path: String = "") throws(APIError) {
        let reader = try AnswerReader(json, at: path)
        self.json = json
        id = try reader.string("id")
        sessionID = try reader.string("session_id")
        kind = try reader.value("kind", as: Kind.self)
        state = try reader.value("state", as: TaskState.self)
        waitingReason = try reader.optionalString("waiting_reason")
        file = try reader.optionalObject("file")?.string("path")
        destination = try reader.optionalObject("download")?.string("destination")
        url = try reader.object("request").string("url")
        uploadProtocol = try reader.optionalObject("upload")?.string("protocol")
        progress = try TaskProgress(reader.object("progress"))
        attempts = Int(try reader.int("attempts"))
        error = try reader.optionalObject("error").map { (error) throws(APIError) in try TaskFailure(error) }
        lastError = try reader.optionalObject("last_error").map { (error) throws(APIError) in try TaskFailure(error) }
        nextAttemptAt = try reader.optionalString("next_attempt_at")
        responseStatus = (try reader.optionalObject("response")?.int("status")).map { Int($0) }
        createdAt = try reader.string("created_at")
    }
}

/// A task's `progress`: one of `bytes_sent` (uploads) and `bytes_received` (downloads) moves.
public struct TaskProgress: Sendable, Equatable {
    public var bytesTransferred: Int64
    public var bytesReceived: Int64
    /// Nil while a download's size is unknown.
    public var bytesTotal: Int64?
    public var fraction: Double
    public var bytesPerSecond: Int64
    public var etaSeconds: Double?

    public init(
        bytesTransferred: Int64 = 0, bytesReceived: Int64 = 0, bytesTotal: Int64?, fraction: Double, bytesPerSecond: Int64 = 0,
        etaSeconds: Double? = nil
    ) {
        self.bytesTransferred = bytesTransferred
        self.bytesReceived = bytesReceived
        self.bytesTotal = bytesTotal
        self.fraction = fraction
        self.bytesPerSecond = bytesPerSecond
        self.etaSeconds = etaSeconds
    }

    init(_ reader: AnswerReader) throws(APIError) {
        self.init(
            bytesTransferred: try reader.optionalInt("bytes_sent") ?? 0,
            bytesReceived: try reader.optionalInt("bytes_received") ?? 0,
            bytesTotal: try reader.optionalInt("bytes_total"), fraction: try reader.optionalDouble("fraction") ?? 0,
            bytesPerSecond: try reader.optionalInt("bytes_per_second") ?? 0, etaSeconds: try reader.optionalDouble("eta_seconds"))
    }

    /// Bytes moved either way (a task counts only one of them).
    public var moved: Int64 { bytesTransferred + bytesReceived }
}

/// A task error object (OpenAPI/backhaul.yaml): code, name, message, the HTTP status when one caused it, and
/// for `last_error` when it happened.
public struct TaskFailure: Sendable, Equatable {
    public var code: Int
    public var name: String
    public var message: String
    public var httpStatus: Int?
    public var at: String?

    init(_ reader: AnswerReader) throws(APIError) {
        code = Int(try reader.int("code"))
        name = try reader.string("name")
        message = try reader.optionalString("message") ?? ""
        httpStatus = try reader.optionalInt("http_status").map { Int($0) }
        at = try reader.optionalString("at")
    }
}

/// One attempt of `GET /v1/tasks/{id}/attempts`.
public struct APIAttempt: Sendable {
    public var json: JSON
    public var number: Int
    public var startedAt: String
    public var endedAt: String?
    public var bytesTransferred: Int64
    public var bytesReceived: Int64
    /// `completed`, `retry`, `failed`, `cancelled`, …
    public var outcome: String
    public var error: TaskFailure?

    public init(json: JSON, at path: String = "") throws(APIError) {
        let reader = try AnswerReader(json, at: path)
        self.json = json
        number = Int(try reader.int("number"))
        startedAt = try reader.string("started_at")
        endedAt = try reader.optionalString("ended_at")
        bytesTransferred = try reader.optionalInt("bytes_sent") ?? 0
        bytesReceived = try reader.optionalInt("bytes_received") ?? 0
        outcome = try reader.string("outcome")
        error = try reader.optionalObject("error").map { (error) throws(APIError) in try TaskFailure(error) }
    }
}

/// One page of `GET /v1/sessions/{id}/tasks`.
public struct TaskPage: Sendable {
    public var tasks: [APITask]
    /// Nil on the last page.
    public var nextCursor: String?

    public init(json: JSON) throws(APIError) {
        let reader = try AnswerReader(json)
        tasks = try reader.array("tasks") { (item, path) throws(APIError) in try APITask(json: item, at: path) }
        nextCursor = try reader.optionalString("next_cursor")
    }
}
