import BackhaulCore
import BackhaulQueue
import JSONCodec
import SQLite

/// What a transition's effects write on SQLite (the rules that decide them: `TransitionRules`):
/// cleanups, and events with their deliveries (the outbox).
extension Store {
    public func insertCleanup(_ db: Connection, taskID: String, _ plan: CleanupPlan, now: Timestamp) throws {
        try db.run(
            "INSERT INTO cleanups (task_id, request, next_attempt_at, created_at) VALUES (?, ?, ?, ?)",
            [taskID, plan.json.serialized(), now, now])
        recorder.update { $0.cleanupsAdded = true }
    }

    /// Appends an event (`data`: its JSON text, written once by the caller) and, in the same transaction, a pending
    /// delivery for every enabled subscription of the session that wants it (the outbox).
    public func appendEvent(_ db: Connection, type: String, sessionID: String, taskID: String?, data: String, now: Timestamp)
        throws
    {
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

    /// Appends a session's events in order, as `appendEvent` each; many rows a statement when the
    /// session has no webhook (no delivery to add for each).
    public func appendEvents(_ db: Connection, sessionID: String, _ events: [NewEvent], now: Timestamp) throws {
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
