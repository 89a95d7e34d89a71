import BackhaulCore
import BackhaulStore
import JSONCodec
import SQLite

/// Carrying out a task transition (`TaskRecord.applying`, in Core) inside the open transaction:
/// the changed columns, the event the new state calls for (with its deliveries), the release of a
/// cancelled task's server side, and the session's end.
extension Store {
    /// Applies `input` to the task `id` and writes the result. Throws `StoreError.notFound`, or
    /// `StoreError.conflict` when the input does not apply to the task as it is.
    @discardableResult
    func transition(_ db: Connection, id: String, _ input: TaskInput, now: Timestamp) throws -> TaskRecord {
        guard let task = try TaskRows.fetch(db, id: id) else { throw StoreError.notFound }
        return try transition(db, task, input, now: now)
    }

    @discardableResult
    func transition(_ db: Connection, _ task: TaskRecord, _ input: TaskInput, now: Timestamp) throws -> TaskRecord {
        let next = try StoreRules.applying(input, to: task, now: now)
        try save(db, from: task, to: next, now: now)
        return next
    }

    /// Writes `after` over `before` (the row as read in this transaction) and records what the
    /// change calls for.
    func save(_ db: Connection, from before: TaskRecord, to after: TaskRecord, now: Timestamp) throws {
        guard after != before else { return }
        try TaskRows.update(db, from: before, to: after, feed: feed)
        try recorded(db, from: before, to: after, now: now)
    }

    /// What a new or changed task calls for besides its row (OpenAPI/backhaul.yaml). `data`, when given, is
    /// the task's JSON already rendered (its event's data).
    func recorded(_ db: Connection, from before: TaskRecord?, to task: TaskRecord, now: Timestamp, data: String? = nil) throws {
        if let type = TaskTransition.event(from: before, to: task) {
            try appendEvent(
                db, type: type.rawValue, sessionID: task.sessionID, taskID: task.id, data: data ?? task.jsonText(), now: now)
        }
        if TaskTransition.releasesServerSide(from: before, to: task) { try scheduleCleanup(db, for: task, now: now) }
        if TaskTransition.finished(from: before, to: task) {
            try sessionTaskReachedFinalState(db, sessionID: task.sessionID, now: now)
        }
    }

    /// A cancelled task whose protocol may have left something at the server (a tus upload, an
    /// S3 multipart upload) gets what releases it, queued in the same transaction: a crash after
    /// the cancel still releases it after the restart.
    func scheduleCleanup(_ db: Connection, for task: TaskRecord, now: Timestamp) throws {
        let defaults = try Store.fetchSession(db, id: task.sessionID)?.configuration.defaultHeaders ?? []
        let machine = TransferMachines.machine(for: task, headers: HeaderRules.merged(defaults, task.request.headers))
        guard let plan = machine.cancellation else { return }
        try insertCleanup(db, taskID: task.id, plan, now: now)
    }

    func insertCleanup(_ db: Connection, taskID: String, _ plan: CleanupPlan, now: Timestamp) throws {
        try db.run(
            "INSERT INTO cleanups (task_id, request, next_attempt_at, created_at) VALUES (?, ?, ?, ?)",
            [taskID, plan.json.serialized(), now, now])
        recorder.update { $0.cleanupsAdded = true }
    }

    /// After a task of the session finished: `session.drained` when nothing is left to do, and
    /// a finishing session's record goes.
    func sessionTaskReachedFinalState(_ db: Connection, sessionID: String, now: Timestamp) throws {
        guard !sessionID.isEmpty, try openTaskCount(db, sessionID: sessionID) == 0 else { return }
        var summary = JSONObject()
        for (state, count) in try counts(db, sessionID: sessionID) { summary[state.rawValue] = .int(Int64(count)) }
        try appendEvent(
            db, type: "session.drained", sessionID: sessionID, taskID: nil,
            data: JSON.object(["session_id": .string(sessionID), "task_counts": .object(summary)]).serialized(), now: now)
        if let session = try Store.fetchSession(db, id: sessionID), session.lifecycle == .finishing {
            try removeSession(db, id: sessionID)
        }
    }

    /// Appends an event (`data`: its JSON text, written once by the caller) and, in the same transaction, a pending
    /// delivery for every enabled subscription of the session that wants it (the outbox).
    func appendEvent(_ db: Connection, type: String, sessionID: String, taskID: String?, data: String, now: Timestamp) throws {
        try insertEvents(db, sessionID: sessionID, [NewEvent(type: type, taskID: taskID, data: data)], now: now)
        if try hasWebhooks(db, sessionID: sessionID) {
            try db.run(
                """
                INSERT INTO deliveries (webhook_id, event_seq, event_type, state, next_attempt_at, created_at)
                SELECT w.id, ?, ?, 'pending', ?, ? FROM webhooks w
                WHERE w.session_id = ? AND w.enabled = 1 AND EXISTS (SELECT 1 FROM json_each(w.events) WHERE value = ?)
                """, [db.lastInsertRowID, type, now, now, sessionID, type])
            if db.changes > 0 { recorder.update { $0.deliveriesAdded = true } }
        }
    }

    /// A session's event about one of its tasks, not yet written.
    struct NewEvent {
        var type: String
        var taskID: String?
        var data: String
    }

    /// Appends a session's events in order, as `appendEvent` each; many rows a statement when the
    /// session has no webhook (no delivery to add for each).
    func appendEvents(_ db: Connection, sessionID: String, _ events: [NewEvent], now: Timestamp) throws {
        guard !events.isEmpty else { return }
        guard try !hasWebhooks(db, sessionID: sessionID) else {
            for event in events {
                try appendEvent(db, type: event.type, sessionID: sessionID, taskID: event.taskID, data: event.data, now: now)
            }
            return
        }
        try insertEvents(db, sessionID: sessionID, events, now: now)
    }

    /// The events' rows alone, many a statement.
    private func insertEvents(_ db: Connection, sessionID: String, _ events: [NewEvent], now: Timestamp) throws {
        try Store.eventInsert.run(db, events) { event, values in
            values += [RandomID.make(prefix: "msg_", at: now), event.type, sessionID, event.taskID, now, event.data]
        }
        recorder.update { $0.eventsAppended = true }
    }

    private static let eventInsert = RowInsert("INSERT INTO events (id, type, session_id, task_id, created_at, data)", columns: 6)
}
