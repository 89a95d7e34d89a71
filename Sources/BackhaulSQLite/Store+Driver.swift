import BackhaulCore
import BackhaulQueue
import SQLite

/// The SQLite driver under the store's rules (`StoreDriver`): its SQL, inside the single writer's
/// transaction, which holds every row it reads until it commits (no row locks to take).
extension Store: StoreDriver {
    @discardableResult
    public func write<T>(_ body: @escaping (Connection) throws -> T) throws(StoreError) -> T {
        try write(.synced, body)
    }

    public func lockedTask(_ db: Connection, id: String) throws -> TaskRecord? { try TaskRows.fetch(db, id: id) }

    public func lockedTask(_ db: Connection, sequence: Int64) throws -> TaskRecord? {
        try TaskRows.fetch(db, sequence: sequence)
    }

    public func currentTask(_ db: Connection, sequence: Int64) throws -> TaskRecord? {
        try TaskRows.fetch(db, sequence: sequence)
    }

    public func lockedUnfinishedTasks(_ db: Connection) throws -> [TaskRecord] {
        try db.query("SELECT \(TaskRows.columns) FROM tasks WHERE \(StoreRules.unfinishedCondition)", [], TaskRows.decode)
    }

    public func writeRow(_ db: Connection, from before: TaskRecord, to after: TaskRecord) throws -> TaskRecord {
        try TaskRows.update(db, from: before, to: after, feed: feed)
        return after
    }

    public func writeProgress(
        _ db: Connection, sequence: Int64, attempt: Int, bytesTransferred: Int64, checkpoint: String?
    ) throws {
        try TaskRows.saveProgress(
            db, sequence: sequence, attempt: attempt, bytesTransferred: bytesTransferred, checkpoint: checkpoint)
    }

    public func appendAttempt(_ db: Connection, taskSequence: Int64, _ record: AttemptRecord) throws {
        try Store.appendAttempt(db, taskSequence: taskSequence, record)
    }

    public func taskSequence(_ db: Connection, id: String) throws -> Int64? {
        try db.queryFirst("SELECT seq FROM tasks WHERE id = ?", [id], { $0.int(0) })
    }

    public func attemptRecords(_ db: Connection, taskSequence: Int64, taskID: String) throws -> [AttemptRecord] {
        try db.query(
            """
            SELECT number, started_at, ended_at, bytes_sent, bytes_received, outcome, http_status, error, network_type
            FROM attempts WHERE task_seq = ? ORDER BY number DESC
            """, [taskSequence]
        ) { row in try StoreRules.decodeAttempt(row, taskID: taskID) }
    }

    public func notePatchedWhileRunning(_ db: Connection, _ task: TaskRecord) { recorder.markPatched(task.sequence) }

    public func sessionRecord(_ db: Connection, id: String) throws -> SessionRecord? { try Store.fetchSession(db, id: id) }

    public func drainedSessionIsFinishing(_ db: Connection, sessionID: String) throws -> Bool? {
        guard try openTaskCount(db, sessionID: sessionID) == 0 else { return nil }
        return try Store.fetchSession(db, id: sessionID)?.lifecycle == .finishing
    }

    public func admissionSession(_ db: Connection, id: String, countOpen: Bool) throws -> (
        session: SessionRecord, open: Int
    )? {
        guard let session = try Store.fetchSession(db, id: id) else { return nil }
        return (session, countOpen ? try openTaskCount(db, sessionID: id) : 0)
    }

    public func heldBytes(_ db: Connection, sessionID: String) throws -> Int64 {
        try db.queryFirst("SELECT COALESCE(SUM(file_size), 0) FROM tasks WHERE \(Store.openInSession)", [sessionID]) {
            $0.int(0)
        } ?? 0
    }

    public func taskByKey(_ db: Connection, sessionID: String, idempotencyKey: String) throws -> TaskRecord? {
        try db.queryFirst(
            "SELECT \(TaskRows.columns) FROM tasks WHERE session_id = ? AND idempotency_key = ? AND detached_from IS NULL",
            [sessionID, idempotencyKey], TaskRows.decode)
    }

    /// The writer numbers new tasks itself, past every task there is and ever was (as the table's
    /// autoincrement would), so that it can write them many rows a statement.
    public func nextSequence(_ db: Connection, _ admission: inout TaskAdmission, remaining: Int) throws -> Int64 {
        if admission.nextSequence == 0 {
            admission.nextSequence =
                try db.queryFirst(
                    """
                    SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'tasks'), 0),
                        COALESCE((SELECT MAX(seq) FROM tasks), 0)) + 1
                    """
                ) { $0.int(0) } ?? 1
        }
        defer { admission.nextSequence += 1 }
        return admission.nextSequence
    }

    /// One node pins nothing: a new task keeps the `node` it came with (none).
    public func pin(for task: TaskRecord) -> String? { task.node }

    public func insertTasks(_ db: Connection, _ results: [TaskBatch.Inserted], at positions: [Int]) throws {
        try TaskRows.insert(db, positions.lazy.map { results[$0].task }, feed: feed)
    }

    public func noteCreated(_ db: Connection, _ results: [TaskBatch.Inserted], at positions: [Int]) {
        let queued = positions.lazy.map { results[$0].task }.filter { $0.state == .queued }
        if !queued.isEmpty { recorder.update { $0.created += queued } }
    }
}

extension Store: SessionDriver {
    public func lockedSessionRecord(_ db: Connection, id: String) throws -> SessionRecord? {
        try Store.fetchSession(db, id: id)
    }

    public func unfinishedTasks(_ db: Connection, sessionID: String) throws -> [TaskRecord] {
        try db.query(
            "SELECT \(TaskRows.columns) FROM tasks WHERE \(Store.openInSession) ORDER BY seq", [sessionID], TaskRows.decode)
    }

    public func unfinishedOverrides(_ db: Connection, sessionID: String) throws -> [(String, String)] {
        try db.query(
            """
            SELECT id, configuration FROM tasks
            WHERE \(Store.openInSession) AND configuration != '{}' ORDER BY seq
            """, [sessionID]
        ) { ($0.string(0), $0.string(1)) }
    }

    public func lockedWebhook(_ db: Connection, id: String) throws -> WebhookRecord? { try Store.fetchWebhook(db, id: id) }

    public func deleteWebhookRow(_ db: Connection, id: String) throws {
        try db.run("DELETE FROM webhooks WHERE id = ?", [id])
    }

    public func lockedPendingDelivery(_ db: Connection, sequence: Int64) throws -> (webhookID: String, history: String)? {
        try db.queryFirst(
            "SELECT webhook_id, history FROM deliveries WHERE seq = ? AND state = 'pending'", [sequence],
            { ($0.string(0), $0.string(1)) })
    }

    public func writeDeliveryAttempt(
        _ db: Connection, sequence: Int64, state: DeliveryRecord.State, next: Timestamp?, status: Int?, error: String?,
        history: String, now: Timestamp
    ) throws {
        try db.run(
            """
            UPDATE deliveries SET state = ?, attempts = attempts + 1, next_attempt_at = ?, last_status = ?, last_error = ?,
                history = ?, finished_at = ?
            WHERE seq = ?
            """,
            [state.rawValue, next, status, error, history, state == .pending ? nil : now, sequence])
    }

    public func disableWebhook(_ db: Connection, id: String, reason: String) throws {
        try db.run("UPDATE webhooks SET enabled = 0, disabled_reason = ? WHERE id = ?", [reason, id])
    }

    /// Of one state or all (`?2` NULL).
    public func deliveryRows(
        _ db: Connection, webhookID: String, state: DeliveryRecord.State?, after: Int64, limit: Int
    ) throws -> [DeliveryRecord] {
        try db.query(
            """
            \(StoreRules.deliverySelect) WHERE d.webhook_id = ?1 AND (?2 IS NULL OR d.state = ?2) AND d.seq > ?3
            ORDER BY d.seq LIMIT ?4
            """, [webhookID, state?.rawValue, after, limit], StoreRules.decodeDelivery)
    }
}
