import BackhaulCore
import BackhaulQueue
import JSONCodec
import PostgreSQL

/// What a transition's effects write on PostgreSQL (the rules that decide them: `TransitionRules`),
/// and the lease a transition takes or gives back, which only this driver has.
extension PostgresStore {
    @discardableResult
    func transition(
        _ tx: PostgresTransaction, _ task: TaskRecord, _ input: TaskInput, now: Timestamp,
        lease: PostgresTaskRows.LeaseChange
    ) throws -> TaskRecord {
        try save(tx, from: task, to: try StoreRules.applying(input, to: task, now: now), now: now, lease: lease)
    }

    /// Writes `after` over `before` (the row as read, locked), changing the lease as told, and
    /// records what the change calls for (`save` without a lease change is the rules').
    @discardableResult
    func save(
        _ tx: PostgresTransaction, from before: TaskRecord, to after: TaskRecord, now: Timestamp,
        lease: PostgresTaskRows.LeaseChange
    ) throws -> TaskRecord {
        guard after != before || lease != .keep else { return after }
        let written =
            try PostgresTaskRows.update(tx, from: before, to: after, lease: lease, leaseSeconds: options.leaseSeconds) ?? after
        try recorded(tx, from: before, to: written, now: now)
        return written
    }

    /// An event of the transaction: written at its end, in order, under the events' lock
    /// (`PostgresWriter`), with its deliveries.
    public func appendEvent(
        _ tx: PostgresTransaction, type: String, sessionID: String, taskID: String?, data: String, now: Timestamp
    ) {
        tx.events.append(.init(type: type, sessionID: sessionID, taskID: taskID, data: data, createdAt: now))
    }

    public func insertCleanup(_ tx: PostgresTransaction, taskID: String, _ plan: CleanupPlan, now: Timestamp) throws {
        try tx.execute(
            "INSERT INTO cleanups (task_id, request, next_attempt_at, created_at) VALUES ($1, $2, $3, $4)",
            [.text(taskID), .text(plan.json.serialized()), .double(now), .double(now)])
        tx.changes.cleanupsAdded = true
    }

    // MARK: Sessions

    static let sessionColumns = "id, configuration, enabled, lifecycle, created_at"

    func fetchSession(_ tx: PostgresTransaction, id: String, lock: Bool) throws -> SessionRecord? {
        try tx.first(
            "SELECT \(Self.sessionColumns) FROM sessions WHERE id = $1\(lock ? " FOR UPDATE" : "")", [.text(id)],
            StoreRules.decodeSession)
    }

    public func saveSession(_ tx: PostgresTransaction, _ session: SessionRecord) throws {
        try tx.execute(
            """
            INSERT INTO sessions (id, configuration, enabled, lifecycle, created_at) VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (id) DO UPDATE SET configuration = excluded.configuration, enabled = excluded.enabled,
                lifecycle = excluded.lifecycle
            """,
            [
                .text(session.id), .text(session.configuration.json.serialized()), .flag(session.enabled),
                .text(session.lifecycle.rawValue), .double(session.createdAt),
            ])
        tx.changes.sessions.insert(session.id)
        tx.lockedSessions[session.id] = nil
    }

    /// The session's tasks by state, as this transaction sees them.
    public func counts(_ tx: PostgresTransaction, sessionID: String) throws -> [TaskState: Int] {
        var counts: [TaskState: Int] = [:]
        for (name, count) in try tx.rows(
            "SELECT state, count(*) FROM tasks WHERE session_id = $1 GROUP BY state", [.text(sessionID)],
            { ($0.string(0), Int($0.int(1))) })
        {
            guard let state = TaskState(rawValue: name) else {
                throw StoreError.corrupt("session \(sessionID) has tasks in the state \(name)")
            }
            counts[state] = count
        }
        return counts
    }

    /// The session, its row locked until the transaction ends, and its unfinished tasks: as
    /// committed in its row, with this transaction's changes. One round trip.
    func lockedSession(_ tx: PostgresTransaction, id: String) throws -> (SessionRecord, open: Int)? {
        if let (session, open) = tx.lockedSessions[id] { return (session, open + (tx.openDeltas[id] ?? 0)) }
        guard
            let (session, open) = try tx.first(
                "SELECT \(Self.sessionColumns), open_tasks FROM sessions WHERE id = $1 FOR UPDATE", [.text(id)],
                { row in (try StoreRules.decodeSession(row), Int(row.int(5))) })
        else { return nil }
        tx.lockedSessions[id] = (session, open)
        return (session, open + (tx.openDeltas[id] ?? 0))
    }

    /// Removes the session's record; its tasks (all final by now) stay readable by id, detached.
    public func removeSession(_ tx: PostgresTransaction, id: String) throws {
        try tx.execute("UPDATE tasks SET detached_from = session_id, session_id = '' WHERE session_id = $1", [.text(id)])
        try tx.execute("DELETE FROM sessions WHERE id = $1", [.text(id)])
        tx.changes.sessions.insert(id)
        tx.lockedSessions[id] = nil
    }

    /// The session's unfinished tasks in creation order, locked.
    public func unfinishedTasks(_ tx: PostgresTransaction, sessionID: String) throws -> [TaskRecord] {
        try tx.rows(
            "\(PostgresTaskRows.select) WHERE session_id = $1 AND finished_at IS NULL ORDER BY seq FOR UPDATE",
            [.text(sessionID)], PostgresTaskRows.decode)
    }
}
