import BackhaulCore
import JSONCodec
import Threads

/// The rules and row formats both drivers follow (SQLite: `Store`, PostgreSQL: `PostgresStore`):
/// what a stored row means, the SQL words both dialects share, and what a change makes of a record.
package enum StoreRules {}

extension StoreRules {
    /// Conditions on `state` without IN lists, as the partial indexes are written (a query must use
    /// the same words for SQLite to use them).
    package static let finalCondition = "(state = 'completed' OR state = 'failed' OR state = 'cancelled')"

    package static let unfinishedCondition = "state != 'completed' AND state != 'failed' AND state != 'cancelled'"

    /// A session row. Its configuration was validated when it was written; read back it is
    /// applied over the defaults like any stored configuration, and refused as corrupt if that
    /// fails (never replaced by the defaults).
    package static func decodeSession(_ row: some StoredRow) throws -> SessionRecord {
        let id = row.string(0)
        let configuration: TransferConfiguration
        do {
            configuration = try decodedConfigurations.configuration(row.string(1))
        } catch {
            throw StoreError.corrupt("session \(id) has a configuration this build cannot read (\(error))")
        }
        guard let lifecycle = SessionRecord.Lifecycle(rawValue: row.string(3)) else {
            throw StoreError.corrupt("session \(id) is \(row.string(3))")
        }
        return SessionRecord(
            id: id, configuration: configuration, enabled: row.int(2) != 0, lifecycle: lifecycle,
            createdAt: row.double(4))
    }

    /// A client's change of `stored` (PATCH), its configuration checked against the unfinished
    /// tasks' own overrides (`check`); the session as changed, and what its unfinished tasks get:
    /// held or released when it is disabled or enabled, cancelled with reason 1 when
    /// `cancelPending`; nil when they are left as they are.
    package static func sessionUpdate(
        _ stored: SessionRecord, cancelPending: Bool,
        _ change: (SessionRecord) throws -> (configuration: TransferConfiguration?, enabled: Bool?),
        check: (TransferConfiguration) throws -> Void
    ) throws -> (SessionRecord, TaskInput?) {
        var session = stored
        let (configuration, enabled) = try change(session)
        if let configuration, configuration != session.configuration {
            try check(configuration)
            session.configuration = configuration
        }
        let enabling = enabled.map { $0 != session.enabled } ?? false
        if let enabled { session.enabled = enabled }
        guard enabling || cancelPending else { return (session, nil) }
        return (
            session,
            cancelPending
                ? .serviceCancelled(.backgroundUpdatesDisabled, "cancelled: transfers were disabled for the session")
                : .sessionEnabled(session.enabled)
        )
    }

    /// The same over the unfinished tasks' ids and stored overrides, in creation order.
    package static func checkOverrides(_ rows: [(String, String)], against configuration: TransferConfiguration) throws {
        var refused: [String] = []
        var reason = ""
        for (taskID, overrides) in rows {
            do {
                _ = try configuration.applying(.object(try TaskRows.overrides(overrides, task: taskID)))
            } catch let error as ValidationError {
                if refused.isEmpty { reason = error.description }
                refused.append(taskID)
            }
        }
        guard !refused.isEmpty else { return }
        let named = refused.prefix(10).joined(separator: ", ") + (refused.count > 10 ? " and \(refused.count - 10) more" : "")
        throw ValidationError(
            "configuration",
            "cannot be applied under the own configuration of task(s) \(named) (\(reason)); "
                + "PATCH or cancel those tasks first")
    }

    package static let decodedConfigurations = DecodedConfigurations()

    package static let eventColumns = "seq, id, type, session_id, task_id, created_at, data"

    package static func decodeEvent(_ row: some StoredRow) -> EventRecord {
        EventRecord(
            sequence: row.int(0), id: row.string(1), type: row.string(2), sessionID: row.string(3),
            taskID: row.optionalString(4), createdAt: row.double(5), dataText: row.string(6))
    }

    /// The events after `sequence` of the sessions `allowed` lets through (a client sees its own
    /// sessions' events), read page by page with `page` (the events after a sequence, oldest first)
    /// and filtered here, up to `limit`.
    package static func events(
        after sequence: Int64, limit: Int, allowed: (String) -> Bool, page: (Int64) throws -> [EventRecord]
    ) rethrows -> [EventRecord] {
        var result: [EventRecord] = []
        var cursor = sequence
        while result.count < limit {
            let events = try page(cursor)
            guard let last = events.last else { break }
            cursor = last.sequence
            result += events.filter { allowed($0.sessionID) }
        }
        return Array(result.prefix(limit))
    }

    /// A client's change of `current` (PATCH) and the move it calls for (`TaskInput.patched`), and
    /// whether it abandons the task's upload resource at the server (to be released as on cancel).
    package static func patched(
        _ current: TaskRecord, _ change: (inout TaskRecord) throws -> Void, now: Timestamp
    ) throws -> (TaskRecord, releases: Bool) {
        guard !current.state.isFinal else { throw StoreError.conflict("the task is \(current.state.rawValue)") }
        var changed = current
        try change(&changed)
        guard case .success(let next) = changed.applying(.patched, now: now) else {
            throw StoreError.conflict("the task is \(current.state.rawValue)")
        }
        return (next, TaskTransition.abandonsUploadResource(from: current, to: changed))
    }

    /// An attempt's row: number, started_at, ended_at, bytes_sent, bytes_received, outcome,
    /// http_status, error, network_type.
    package static func decodeAttempt(_ row: some StoredRow, taskID: String) throws -> AttemptRecord {
        guard let outcome = AttemptRecord.Outcome(rawValue: row.string(5)) else {
            throw StoreError.corrupt("attempt \(row.int(0)) of task \(taskID) has the outcome \(row.string(5))")
        }
        return AttemptRecord(
            number: Int(row.int(0)), startedAt: row.double(1), endedAt: row.double(2), bytesTransferred: row.int(3),
            bytesReceived: row.int(4), outcome: outcome, httpStatus: row.optionalInt(6).map { Int($0) },
            error: try row.optionalString(7).flatMap { TaskRecord.decodeError(try JSON.parse($0, maxDepth: 16)) },
            networkType: row.optionalString(8).flatMap(NetworkType.init(rawValue:)))
    }

    /// `task` moved by `input`; `StoreError.conflict` when the input does not apply to it as it is.
    package static func applying(_ input: TaskInput, to task: TaskRecord, now: Timestamp) throws -> TaskRecord {
        switch task.applying(input, now: now) {
        case .failure(let refused):
            throw StoreError.conflict("cannot \(refused.input) a task that is \(refused.state.rawValue)")
        case .success(let next):
            return next
        }
    }

    /// `session.drained` means "everything before was delivered": it waits until every earlier
    /// delivery to the same subscription has ended (in flight ones are still `pending`).
    package static let drainedIsLast = """
        (d.event_type != 'session.drained' OR NOT EXISTS (SELECT 1 FROM deliveries p
            WHERE p.webhook_id = d.webhook_id AND p.state = 'pending' AND p.seq < d.seq))
        """

    package static let webhookColumns =
        "id, session_id, url, events, secret, previous_secret, previous_secret_expires_at, enabled, disabled_reason, created_at"

    package static func decodeWebhook(_ row: some StoredRow) throws -> WebhookRecord {
        let events =
            (try JSON.parse(row.string(3))).arrayValue?.compactMap { $0.stringValue.flatMap(EventType.init(rawValue:)) } ?? []
        var webhook = WebhookRecord(
            id: row.string(0), sessionID: row.string(1), url: row.string(2), events: events,
            secret: row.string(4), createdAt: row.double(9))
        webhook.previousSecret = row.optionalString(5)
        webhook.previousSecretExpiresAt = row.optionalDouble(6)
        webhook.enabled = row.int(7) != 0
        webhook.disabledReason = row.optionalString(8)
        return webhook
    }

    /// A subscription's deliveries with their events' ids and types, read by `decodeDelivery`.
    package static let deliverySelect = """
        SELECT d.seq, d.webhook_id, d.event_seq, e.id, e.type, d.state, d.attempts, d.next_attempt_at, d.last_status,
            d.last_error, d.history, d.created_at, d.finished_at
        FROM deliveries d JOIN events e ON e.seq = d.event_seq
        """

    package static func decodeDelivery(_ row: some StoredRow) -> DeliveryRecord {
        DeliveryRecord(
            sequence: row.int(0), webhookID: row.string(1), eventSequence: row.int(2), eventID: row.string(3),
            eventType: row.string(4), state: DeliveryRecord.State(rawValue: row.string(5)) ?? .pending,
            attempts: Int(row.int(6)), nextAttemptAt: row.optionalDouble(7), lastStatus: row.optionalInt(8).map { Int($0) },
            lastError: row.optionalString(9), history: (try? JSON.parse(row.string(10))) ?? .array([]),
            createdAt: row.double(11), finishedAt: row.optionalDouble(12))
    }

    /// A page of deliveries read with one more than `limit`: the extra one says a next page exists.
    package static func page(_ rows: [DeliveryRecord], limit: Int) -> (deliveries: [DeliveryRecord], nextCursor: String?) {
        page(rows, limit: limit, sequence: \.sequence)
    }

    /// A page from up to `limit + 1` rows read in order: the one past the limit only says there is
    /// more, and the cursor is the last kept row's sequence.
    package static func page<Row>(_ rows: [Row], limit: Int, sequence: (Row) -> Int64) -> ([Row], nextCursor: String?) {
        guard rows.count > limit else { return (rows, nil) }
        let kept = Array(rows.prefix(limit))
        return (kept, kept.last.map { String(sequence($0)) })
    }

    /// A due delivery from the columns `d.seq, d.webhook_id, w.url, w.secret, w.previous_secret,
    /// w.previous_secret_expires_at, e.id, e.type, e.created_at, e.data, d.attempts`: signed with
    /// the current secret, and the previous one while it has not expired.
    package static func decodePendingDelivery(_ row: some StoredRow, now: Timestamp) -> PendingDelivery {
        var secrets = [row.string(3)]
        if let previous = row.optionalString(4), let expires = row.optionalDouble(5), expires > now {
            secrets.append(previous)
        }
        // The body is built around the stored event data, never parsed again: the same bytes
        // on every redelivery.
        let event = EventRecord(
            sequence: 0, id: row.string(6), type: row.string(7), sessionID: "", taskID: nil,
            createdAt: row.double(8), dataText: row.string(9))
        return PendingDelivery(
            sequence: row.int(0), webhookID: row.string(1), url: row.string(2), secrets: secrets,
            eventID: row.string(6), payload: Array(event.payloadText.utf8), attempts: Int(row.int(10)))
    }

    /// What an attempt's result makes of a delivery: its state, its next attempt, and its
    /// history (the last 20 attempts) with this one appended.
    package static func attemptRecorded(
        history text: String, now: Timestamp, status: Int?, error: String?, decision: DeliveryPlan.Decision
    ) -> (state: DeliveryRecord.State, next: Timestamp?, history: String) {
        var history = (try? JSON.parse(text))?.arrayValue ?? []
        history.append([
            "at": .string(RFC3339.format(now)), "status": status.map { .int(Int64($0)) } ?? .null,
            "error": error.map { .string($0) } ?? .null,
        ])
        let (state, next): (DeliveryRecord.State, Timestamp?) =
            switch decision {
            case .delivered: (.delivered, nil)
            case .retry(let at): (.pending, at)
            case .failed: (.failed, nil)
            case .gone: (.abandoned, nil)
            }
        return (state, next, JSON.array(Array(history.suffix(20))).serialized())
    }

    /// A cleanup from the columns `seq, request, attempts, task_id`.
    package static func decodeCleanup(_ row: some StoredRow) -> DueCleanup {
        let text = row.string(1)
        let plan = Result { () throws(StoreError) in
            guard let value = try? JSON.parse(text), let plan = CleanupPlan.decode(value) else {
                throw StoreError.corrupt("cleanup \(row.int(0)) holds \(text.prefix(200))")
            }
            return plan
        }
        return (row.int(0), plan, Int(row.int(2)), row.string(3))
    }
}

/// Session configurations as decoded from their stored text (applied over the defaults): every
/// task creation reads its session, which need not parse and apply the same text each time. The
/// value is a function of the text alone, so nothing here is ever out of date; the table is
/// emptied when it holds more texts than any daemon has sessions.
package final class DecodedConfigurations: Sendable {
    private let table = Locked<[String: TransferConfiguration]>([:])
    static let limit = 1024

    package func configuration(_ text: String) throws -> TransferConfiguration {
        if let known = table.withLock({ $0[text] }) { return known }
        let decoded = try TransferConfiguration().applying(JSON.parse(text, maxDepth: 64))
        table.withLock { table in
            if table.count >= Self.limit { table.removeAll() }
            table[text] = decoded
        }
        return decoded
    }
}

/// Committed session records, kept for reads: a POST of a task reads its session for the
/// configuration it validates against, and that read was a read transaction of its own on
/// every request. A commit that changes sessions forgets them (each store observes its commits
/// before it answers the write, and a PostgreSQL node hears the other nodes'), and a record read
/// from a snapshot older than such a commit is not kept: the generation moved while it was read.
package struct SessionCache: Sendable {
    package var records: [String: SessionRecord] = [:]
    /// Moves on every commit that changed a session.
    package var generation = 0

    package init() {}

    /// Forgets the sessions `changes` touched, or every one after changes that may have been
    /// missed (`queueReload`: a node's feed reconnected).
    package mutating func forget(_ changes: StoreChanges) {
        guard !changes.sessions.isEmpty || changes.queueReload else { return }
        if changes.queueReload { records = [:] }
        for id in changes.sessions { records[id] = nil }
        generation += 1
    }

    mutating func keep(_ record: SessionRecord, readAt generation: Int) {
        guard generation == self.generation else { return }
        records[record.id] = record
    }

    /// The session's record: kept, or read by `read` and kept unless a commit changed sessions
    /// meanwhile.
    package static func record(
        _ cache: Locked<SessionCache>, id: String, read: () throws(StoreError) -> SessionRecord?
    ) throws(StoreError) -> SessionRecord? {
        let (cached, generation) = cache.withLock { ($0.records[id], $0.generation) }
        if let cached { return cached }
        let record = try read()
        if let record { cache.withLock { $0.keep(record, readAt: generation) } }
        return record
    }
}

extension TaskError {
    /// How a task whose stored row cannot be read fails, alone, when a write must move it on (a
    /// recovery at start, a takeover in a fleet): -3100 `internal_error`, naming what could not be
    /// read. Both stores follow it (docs/operations.md, "A damaged state").
    package static func unreadableRow(_ message: String) -> TaskError {
        TaskError(.internalError, message: "the task's stored state cannot be read: \(message)")
    }
}

extension StoreRules {
    /// Counts read as (name, count) rows, summed by the name's value; a name this build does not
    /// know is passed to `unknown`, which may throw (a task state) or let it go (a waiting reason,
    /// a delivery state: shown as none).
    package static func counts<Key: RawRepresentable & Hashable>(
        _ rows: [(String, Int)], unknown: (String) throws -> Void = { _ in }
    ) rethrows -> [Key: Int] where Key.RawValue == String {
        var counts: [Key: Int] = [:]
        for (name, count) in rows {
            guard let key = Key(rawValue: name) else {
                try unknown(name)
                continue
            }
            counts[key, default: 0] += count
        }
        return counts
    }

    /// A task state this build does not know, counted: the database is not one it can read.
    package static func unknownState(_ name: String) throws {
        throw StoreError.corrupt("tasks are in the state \(name)")
    }
}
