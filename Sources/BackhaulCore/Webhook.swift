import JSONValue

/// The events of OpenAPI/backhaul.yaml
public enum EventType: String, Sendable, CaseIterable {
    case taskCompleted = "task.completed"
    case taskFailed = "task.failed"
    case taskCancelled = "task.cancelled"
    case taskWaiting = "task.waiting"
    case taskAuthRequired = "task.auth_required"
    case taskProgress = "task.progress"
    case sessionDrained = "session.drained"

    /// What a subscription gets when it names no events: everything but the chatty progress.
    public static let defaultSubscription: [EventType] = allCases.filter { $0 != .taskProgress }

    /// The event a task entering `state` produces, if any.
    public static func forTaskState(_ state: TaskState) -> EventType? {
        switch state {
        case .waiting: return .taskWaiting
        case .authRequired: return .taskAuthRequired
        case .completed: return .taskCompleted
        case .failed: return .taskFailed
        case .cancelled: return .taskCancelled
        case .queued, .running, .retrying, .suspended: return nil
        }
    }
}

/// A webhook subscription of a session (OpenAPI/backhaul.yaml). The secrets are stored to sign with and
/// never shown again after creation or rotation.
public struct WebhookRecord: Sendable, Equatable {
    public var id: String
    public var sessionID: String
    public var url: String
    public var events: [EventType]
    public var secret: String
    public var previousSecret: String?
    public var previousSecretExpiresAt: Timestamp?
    public var enabled = true
    public var disabledReason: String?
    public var createdAt: Timestamp

    public init(id: String, sessionID: String, url: String, events: [EventType], secret: String, createdAt: Timestamp) {
        self.id = id
        self.sessionID = sessionID
        self.url = url
        self.events = events
        self.secret = secret
        self.createdAt = createdAt
    }

    /// The secrets to sign with at `now`: the current one, and the previous during a rotation.
    public func signingSecrets(now: Timestamp) -> [String] {
        if let previousSecret, let expires = previousSecretExpiresAt, expires > now { return [secret, previousSecret] }
        return [secret]
    }

    /// The API's view; the secret only when `showingSecret` (creation, rotation).
    public func json(showingSecret: Bool = false) -> JSON {
        var object: JSONObject = [
            "id": .string(id), "session_id": .string(sessionID), "url": .string(url),
            "events": .array(events.map { .string($0.rawValue) }), "enabled": .bool(enabled),
            "disabled_reason": disabledReason.map { .string($0) } ?? .null, "created_at": .string(RFC3339.format(createdAt)),
            "previous_secret_expires_at": previousSecretExpiresAt.map { .string(RFC3339.format($0)) } ?? .null,
        ]
        if showingSecret { object["secret"] = .string(secret) }
        return .object(object)
    }

    /// `whsec_` + base64 of 24 random bytes.
    public static func generateSecret() -> String {
        var bytes = [UInt8](repeating: 0, count: 24)
        RandomID.fill(&bytes)
        return "whsec_" + Base64.encode(bytes)
    }

    /// The signing key of a `whsec_…` secret, or nil when it is not one (at least 16 bytes).
    public static func key(of secret: String) -> [UInt8]? {
        guard secret.hasPrefix("whsec_"), let key = Base64.decode(String(secret.dropFirst(6))), key.count >= 16, key.count <= 128
        else { return nil }
        return key
    }
}

/// One event's delivery to one subscription.
public struct DeliveryRecord: Sendable, Equatable {
    public enum State: String, Sendable, CaseIterable {
        case pending, delivered, failed
        /// The subscription was deleted or disabled (410 Gone) before this was delivered.
        case abandoned
    }

    public var sequence: Int64
    public var webhookID: String
    public var eventSequence: Int64
    public var eventID: String
    public var eventType: String
    public var state: State
    public var attempts: Int
    public var nextAttemptAt: Timestamp?
    public var lastStatus: Int?
    public var lastError: String?
    public var history: JSON
    public var createdAt: Timestamp
    public var finishedAt: Timestamp?

    public init(
        sequence: Int64, webhookID: String, eventSequence: Int64, eventID: String, eventType: String, state: State,
        attempts: Int, nextAttemptAt: Timestamp?, lastStatus: Int?, lastError: String?, history: JSON,
        createdAt: Timestamp, finishedAt: Timestamp?
    ) {
        self.sequence = sequence
        self.webhookID = webhookID
        self.eventSequence = eventSequence
        self.eventID = eventID
        self.eventType = eventType
        self.state = state
        self.attempts = attempts
        self.nextAttemptAt = nextAttemptAt
        self.lastStatus = lastStatus
        self.lastError = lastError
        self.history = history
        self.createdAt = createdAt
        self.finishedAt = finishedAt
    }

    public var json: JSON {
        [
            "id": .string(String(sequence)), "webhook_id": .string(webhookID), "event_id": .string(eventID),
            "event_type": .string(eventType), "state": .string(state.rawValue), "attempts": .int(Int64(attempts)),
            "next_attempt_at": nextAttemptAt.map { .string(RFC3339.format($0)) } ?? .null,
            "last_status": lastStatus.map { .int(Int64($0)) } ?? .null, "last_error": lastError.map { .string($0) } ?? .null,
            "attempt_history": history, "created_at": .string(RFC3339.format(createdAt)),
            "finished_at": finishedAt.map { .string(RFC3339.format($0)) } ?? .null,
        ]
    }
}

/// What happened to one delivery attempt, and what follows (pure; table-tested).
public enum DeliveryPlan {
    /// 0 s, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h: ten attempts over about three days.
    public static let standardSchedule: [Double] = [0, 5, 300, 1800, 7200, 18_000, 36_000, 50_400, 72_000, 86_400]

    public enum Decision: Sendable, Equatable {
        case delivered
        case retry(at: Timestamp)
        /// Retries are spent.
        case failed
        /// 410 Gone: the subscription is disabled.
        case gone
    }

    /// After attempt number `attempts` (1-based) answered `status` (nil: no answer).
    public static func decide(status: Int?, retryAfter: Double?, attempts: Int, now: Timestamp, schedule: [Double]) -> Decision {
        if let status, (200..<300).contains(status) { return .delivered }
        if status == 410 { return .gone }
        guard attempts < schedule.count else { return .failed }
        let delay = max(schedule[attempts], min(retryAfter ?? 0, 86_400))
        return .retry(at: now + delay)
    }
}
