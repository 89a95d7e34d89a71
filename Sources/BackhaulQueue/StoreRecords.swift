import BackhaulCore
import JSONCodec

/// A task the policy holds, with what deciding again for it needs.
public struct HeldTask: Sendable, Equatable {
    public var sequence: Int64
    public var id: String
    public var sessionID: String
    public var configurationOverrides: JSONObject
    public var reason: WaitingReason

    package init(
        sequence: Int64, id: String, sessionID: String, configurationOverrides: JSONObject, reason: WaitingReason
    ) {
        self.sequence = sequence
        self.id = id
        self.sessionID = sessionID
        self.configurationOverrides = configurationOverrides
        self.reason = reason
    }
}

/// An event written in the same transaction as the state change that caused it (OpenAPI/backhaul.yaml).
public struct EventRecord: Sendable, Equatable {
    public var sequence: Int64
    public var id: String
    public var type: String
    public var sessionID: String
    public var taskID: String?
    public var createdAt: Timestamp
    /// The event's data as stored: serialized once, when the event was written.
    public var dataText: String

    package init(
        sequence: Int64, id: String, type: String, sessionID: String, taskID: String?, createdAt: Timestamp, dataText: String
    ) {
        self.sequence = sequence
        self.id = id
        self.type = type
        self.sessionID = sessionID
        self.taskID = taskID
        self.createdAt = createdAt
        self.dataText = dataText
    }

    /// The Standard Webhooks payload `{"type","timestamp","data"}`, built around the stored data
    /// without parsing it again: the same bytes for every delivery and every stream.
    public var payloadText: String {
        "{\"type\":\"\(type)\",\"timestamp\":\"\(RFC3339.format(createdAt))\",\"data\":\(dataText)}"
    }

    /// The payload as a value (tests and tools; the daemon sends `payloadText`).
    public var payload: JSON { (try? JSON.parse(payloadText, maxDepth: 64)) ?? .null }
}

/// A page of a session's tasks.
public struct TaskPage: Sendable {
    public var tasks: [TaskRecord]
    public var nextCursor: String?

    /// A page from up to `limit + 1` tasks read in order (`StoreRules.page`).
    package init(reading rows: [TaskRecord], limit: Int) {
        (tasks, nextCursor) = StoreRules.page(rows, limit: limit, sequence: \.sequence)
    }
}

/// A delivery ready to send: where, with which secrets, and the exact bytes.
public struct PendingDelivery: Sendable {
    public var sequence: Int64
    public var webhookID: String
    public var url: String
    public var secrets: [String]
    /// The `webhook-id`: the event's id, the same for every redelivery.
    public var eventID: String
    public var payload: [UInt8]
    public var attempts: Int

    package init(
        sequence: Int64, webhookID: String, url: String, secrets: [String], eventID: String, payload: [UInt8], attempts: Int
    ) {
        self.sequence = sequence
        self.webhookID = webhookID
        self.url = url
        self.secrets = secrets
        self.eventID = eventID
        self.payload = payload
        self.attempts = attempts
    }
}

/// A consistent copy of the state while the daemon runs (docs/operations.md, "Backups").
public struct BackupResult: Sendable, Equatable {
    public let path: String
    public let bytes: Int64
    public let seconds: Double

    package init(path: String, bytes: Int64, seconds: Double) {
        self.path = path
        self.bytes = bytes
        self.seconds = seconds
    }
}

/// What the store's housekeeping did, for `/metrics`.
public struct MaintenanceFigures: Sendable, Equatable {
    /// Transactions the writer committed.
    public var commits = 0
    public var walFrames = 0
    public var passiveCheckpoints = 0
    public var truncateCheckpoints = 0
    /// Checkpoints held back by another connection, or that could not copy the whole log
    /// (readers needed its older pages).
    public var checkpointsBusy = 0
    /// Checkpoints that failed (an I/O error, a full disk, corruption): logged, and retried later.
    public var checkpointErrors = 0
    /// Syncs of the state that failed (the store failed closed on the first).
    public var syncFailures = 0
    public var tasksPruned = 0
    public var eventsPruned = 0
    public var pagesVacuumed = 0
    public init() {}
}

/// Damage SQLite found in the state database while it was open: by a read, a write (the
/// housekeeping's among them), or the background check (`IntegrityScan`). Reported in `/v1/info`
/// (`state.damage`), the metrics and the dashboard as a salvage at start is; a store that found
/// damage leaves no clean-stop mark, so the next start reads every page and salvages
/// (docs/operations.md, "A damaged state").
public struct StateDamage: Sendable, Equatable {
    /// When it was first found.
    public var at: Timestamp
    /// SQLite's words, or `quick_check`'s.
    public var reason: String
    /// What found it: "a read", "a write" or "the background check".
    public var foundBy: String

    package init(at: Timestamp, reason: String, foundBy: String) {
        self.at = at
        self.reason = reason
        self.foundBy = foundBy
    }
}

/// A cleanup row as read: the request it asks for, or why it cannot be read.
public typealias DueCleanup = (
    sequence: Int64, plan: Result<CleanupPlan, StoreError>, attempts: Int, taskID: String
)
