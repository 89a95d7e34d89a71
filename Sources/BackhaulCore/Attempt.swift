import JSONValue

/// The error of a task's latest failed attempt and when it happened (OpenAPI/backhaul.yaml `last_error`):
/// what a task in `retrying` shows long before it fails.
public struct LastError: Sendable, Equatable {
    public var error: TaskError
    public var at: Timestamp

    public init(_ error: TaskError, at: Timestamp) {
        self.error = error
        self.at = at
    }

    public var json: JSON {
        guard case .object(var object) = TaskRecord.errorJSON(error) else { return .null }
        object["at"] = .string(RFC3339.format(at))
        return .object(object)
    }

    public static func decode(_ value: JSON) -> LastError? {
        guard let error = TaskRecord.decodeError(value), let at = value["at"]?.stringValue.flatMap(RFC3339.parse) else {
            return nil
        }
        return LastError(error, at: at)
    }
}

/// One attempt of a task, as `GET /v1/tasks/{id}/attempts` lists it (OpenAPI/backhaul.yaml).
public struct AttemptRecord: Sendable, Equatable {
    /// What the attempt led to: the task completed, will try again (after a backoff, or new
    /// credentials), failed, or was stopped without fault (a policy hold, a shutdown, a client's
    /// cancel or suspend).
    public enum Outcome: String, Sendable, CaseIterable {
        case completed, retry, failed, stopped
    }

    /// The attempt's place in the task's history, from 1. Stopped attempts are listed but not
    /// counted in the task's `attempts`, so the numbers can run ahead of it.
    public var number: Int
    public var startedAt: Timestamp
    public var endedAt: Timestamp
    public var bytesTransferred: Int64
    public var bytesReceived: Int64
    public var outcome: Outcome
    public var httpStatus: Int?
    public var error: TaskError?
    public var networkType: NetworkType?

    /// The most attempts a task keeps in its history (older ones are dropped).
    public static let historyLimit = 50

    public init(
        number: Int = 0, startedAt: Timestamp, endedAt: Timestamp, bytesTransferred: Int64, bytesReceived: Int64,
        outcome: Outcome, httpStatus: Int? = nil, error: TaskError? = nil, networkType: NetworkType? = nil
    ) {
        self.number = number
        self.startedAt = startedAt
        self.endedAt = endedAt
        self.bytesTransferred = bytesTransferred
        self.bytesReceived = bytesReceived
        self.outcome = outcome
        self.httpStatus = httpStatus
        self.error = error
        self.networkType = networkType
    }

    public var json: JSON {
        [
            "number": .int(Int64(number)), "started_at": .string(RFC3339.format(startedAt)),
            "ended_at": .string(RFC3339.format(endedAt)), "bytes_sent": .int(bytesTransferred),
            "bytes_received": .int(bytesReceived),
            "outcome": .string(outcome.rawValue), "http_status": httpStatus.map { .int(Int64($0)) } ?? .null,
            "error": error.map(TaskRecord.errorJSON) ?? .null, "network_type": networkType.map { .string($0.rawValue) } ?? .null,
        ]
    }

    /// The entry as its attempt ended: `end`'s outcome, and its error when it has one.
    public func ended(by end: AttemptEnd) -> AttemptRecord {
        var entry = self
        entry.outcome = end.outcome
        if let error = end.error { entry.error = error }
        return entry
    }
}

extension AttemptFailure {
    /// The error this failure shows as the task's `last_error` (and as its `error` if no retry
    /// follows): the same words the retry planner uses when it gives up.
    public var error: TaskError {
        switch self {
        case .http(401, _, _, _):
            return TaskError(.userAuthenticationRequired, message: "the server answered 401", httpStatus: 401)
        case .credentialsExpired(let status):
            return TaskError(
                .userAuthenticationRequired, message: "the server answered \(status): the credentials or the signed URL expired",
                httpStatus: status, reason: .credentialsExpired)
        case .credentialsRenewed(let status, let message):
            return TaskError(
                .userAuthenticationRequired, message: "the server answered \(status): \(message)", httpStatus: status,
                reason: .credentialsExpired)
        case .http(let status, _, _, let code):
            let named = code.map { " (\($0))" } ?? ""
            return TaskError(.badServerResponse, message: "the server answered \(status)\(named)", httpStatus: status)
        case .checksumMismatch(let status):
            return TaskError(
                .badServerResponse, message: "the server's checksum of the body did not match the one sent (\(status))",
                httpStatus: status)
        case .transport(let kind, let message):
            return TaskError(kind.errorKind, message: message)
        case .fatal(let error):
            return error
        }
    }

    /// The HTTP status of the answer that ended the attempt, if one did.
    public var httpStatus: Int? {
        switch self {
        case .http(let status, _, _, _), .checksumMismatch(let status), .credentialsExpired(let status),
            .credentialsRenewed(let status, _):
            return status
        case .fatal(let error): return error.httpStatus
        case .transport: return nil
        }
    }
}
