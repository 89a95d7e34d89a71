import BackhaulCore
import BackhaulQueue
import PostgreSQL

/// The PostgreSQL driver under the store's rules (`StoreDriver`): its SQL, with the row locks that
/// make nodes changing one task or one session take turns (`FOR UPDATE`), and the pin.
extension PostgresStore: StoreDriver {
    @discardableResult
    public func write<T>(_ body: @escaping (PostgresTransaction) throws -> T) throws(StoreError) -> T {
        try write(fenced: false, body)
    }

    public func submit<T>(_ body: @escaping (PostgresTransaction) throws -> T, done: @escaping (Result<T, StoreError>) -> Void) {
        submit(durable: false, body, done: done)
    }

    public func lockedTask(_ tx: PostgresTransaction, id: String) throws -> TaskRecord? {
        try PostgresTaskRows.fetch(tx, id: id)
    }

    public func lockedTask(_ tx: PostgresTransaction, sequence: Int64) throws -> TaskRecord? {
        try PostgresTaskRows.fetch(tx, sequence: sequence)
    }

    public func currentTask(_ tx: PostgresTransaction, sequence: Int64) throws -> TaskRecord? {
        try PostgresTaskRows.fetch(tx, sequence: sequence, lock: false)
    }

    public func lockedUnfinishedTasks(_ tx: PostgresTransaction) throws -> [TaskRecord] {
        try tx.rows(
            "\(PostgresTaskRows.select) WHERE finished_at IS NULL ORDER BY seq FOR UPDATE", [], PostgresTaskRows.decode)
    }

    /// The revision counted, the lease kept.
    public func writeRow(_ tx: PostgresTransaction, from before: TaskRecord, to after: TaskRecord) throws -> TaskRecord {
        try PostgresTaskRows.update(tx, from: before, to: after, lease: .keep, leaseSeconds: options.leaseSeconds) ?? after
    }

    public func writeProgress(
        _ tx: PostgresTransaction, sequence: Int64, attempt: Int, bytesTransferred: Int64, checkpoint: String?
    ) {
        PostgresTaskRows.saveProgress(
            tx, sequence: sequence, attempt: attempt, bytesTransferred: bytesTransferred, checkpoint: checkpoint)
    }

    public func appendAttempt(_ tx: PostgresTransaction, taskSequence: Int64, _ record: AttemptRecord) throws {
        try PostgresTaskRows.appendAttempt(tx, taskSequence: taskSequence, record)
    }

    public func taskSequence(_ tx: PostgresTransaction, id: String) throws -> Int64? {
        try tx.first("SELECT seq FROM tasks WHERE id = $1", [.text(id)], { $0.int(0) })
    }

    public func attemptRecords(_ tx: PostgresTransaction, taskSequence: Int64, taskID: String) throws -> [AttemptRecord] {
        try tx.rows(
            """
            SELECT number, started_at, ended_at, bytes_sent, bytes_received, outcome, http_status, error, network_type
            FROM attempts WHERE task_seq = $1 ORDER BY number DESC
            """, [.int(taskSequence)]
        ) { row in try StoreRules.decodeAttempt(row, taskID: taskID) }
    }

    /// Nothing to note: the change counted the row's revision, so the attempt's end reads it again.
    public func notePatchedWhileRunning(_ tx: PostgresTransaction, _ task: TaskRecord) {}

    public func appendEvents(_ tx: PostgresTransaction, sessionID: String, _ events: [NewEvent], now: Timestamp) {
        for event in events {
            appendEvent(tx, type: event.type, sessionID: sessionID, taskID: event.taskID, data: event.data, now: now)
        }
    }

    public func sessionRecord(_ tx: PostgresTransaction, id: String) throws -> SessionRecord? {
        try fetchSession(tx, id: id, lock: false)
    }

    /// The session's row is locked first, so that two nodes ending its last two tasks at once count
    /// one after the other, and one of them says it drained.
    public func drainedSessionIsFinishing(_ tx: PostgresTransaction, sessionID: String) throws -> Bool? {
        guard let (session, open) = try lockedSession(tx, id: sessionID), open == 0 else { return nil }
        return session.lifecycle == .finishing
    }

    /// The session's row is locked for the batch, so that the open-task limit and the quota hold
    /// across the fleet: two nodes adding to one session take turns.
    public func admissionSession(_ tx: PostgresTransaction, id: String, countOpen: Bool) throws -> (
        session: SessionRecord, open: Int
    )? {
        try lockedSession(tx, id: id).map { (session: $0.0, open: $0.open) }
    }

    public func heldBytes(_ tx: PostgresTransaction, sessionID: String) throws -> Int64 {
        try tx.first(
            "SELECT COALESCE(sum(file_size), 0) FROM tasks WHERE session_id = $1 AND finished_at IS NULL", [.text(sessionID)]
        ) { $0.int(0) } ?? 0
    }

    public func taskByKey(_ tx: PostgresTransaction, sessionID: String, idempotencyKey: String) throws -> TaskRecord? {
        try tx.first(
            "\(PostgresTaskRows.select) WHERE session_id = $1 AND idempotency_key = $2 AND detached_from IS NULL",
            [.text(sessionID), .text(idempotencyKey)], PostgresTaskRows.decode)
    }

    /// From a block this node took from the table's sequence (one round trip every 200 tasks, not
    /// one per request; the block kept in descending order). Sequences are unique and rise on each
    /// node; a block given back by a rolled-back transaction is a gap, as a rolled-back `nextval` is.
    public func nextSequence(_ tx: PostgresTransaction, _ admission: inout TaskAdmission, remaining: Int) throws -> Int64 {
        if let taken = sequenceBlock.withLock({ $0.popLast() }) { return taken }
        let fetched = try tx.rows(
            "SELECT nextval(pg_get_serial_sequence('tasks', 'seq')) FROM generate_series(1, $1)", [.int(remaining + 200)]
        ) { $0.int(0) }
        sequenceBlock.withLock { $0 = fetched.dropFirst().reversed() }
        return fetched[0]
    }

    /// A new task is pinned to this node unless its file is under a shared root.
    public func pin(for task: TaskRecord) -> String? {
        PostgresTaskRows.pin(for: task, node: node, sharedRoots: options.sharedRoots)
    }

    public func insertTasks(_ tx: PostgresTransaction, _ results: [TaskBatch.Inserted], at positions: [Int]) {
        PostgresTaskRows.insert(tx, positions.map { results[$0].task })
    }

    public func noteCreated(_ tx: PostgresTransaction, _ results: [TaskBatch.Inserted], at positions: [Int]) {
        tx.changes.created += positions.lazy.map { results[$0].task }.filter { $0.state == .queued }
    }
}

extension PostgresStore: SessionDriver {
    public func lockedSessionRecord(_ tx: PostgresTransaction, id: String) throws -> SessionRecord? {
        try fetchSession(tx, id: id, lock: true)
    }

    public func unfinishedOverrides(_ tx: PostgresTransaction, sessionID: String) throws -> [(String, String)] {
        try tx.rows(
            """
            SELECT id, configuration FROM tasks
            WHERE session_id = $1 AND finished_at IS NULL AND configuration != '{}' ORDER BY seq
            """, [.text(sessionID)]
        ) { ($0.string(0), $0.string(1)) }
    }

    public func lockedWebhook(_ tx: PostgresTransaction, id: String) throws -> WebhookRecord? {
        try fetchWebhook(tx, id: id, lock: true)
    }

    public func deleteWebhookRow(_ tx: PostgresTransaction, id: String) throws {
        try tx.execute("DELETE FROM webhooks WHERE id = $1", [.text(id)])
    }

    public func lockedPendingDelivery(_ tx: PostgresTransaction, sequence: Int64) throws -> (
        webhookID: String, history: String
    )? {
        try tx.first(
            "SELECT webhook_id, history FROM deliveries WHERE seq = $1 AND state = 'pending' FOR UPDATE",
            [.int(sequence)], { ($0.string(0), $0.string(1)) })
    }

    /// Ends this node's claim. Another node's claim stays: it took the delivery over and may be
    /// sending it now.
    public func writeDeliveryAttempt(
        _ tx: PostgresTransaction, sequence: Int64, state: DeliveryRecord.State, next: Timestamp?, status: Int?,
        error: String?, history: String, now: Timestamp
    ) throws {
        try tx.execute(
            """
            UPDATE deliveries SET state = $1, attempts = attempts + 1, next_attempt_at = $2, last_status = $3,
                last_error = $4, history = $5, finished_at = $6,
                claimed_by = CASE WHEN claimed_by = $8 THEN NULL ELSE claimed_by END,
                claim_expires_at = CASE WHEN claimed_by = $8 THEN NULL ELSE claim_expires_at END
            WHERE seq = $7
            """,
            [
                .text(state.rawValue), .double(next), .int(status), .text(error), .text(history),
                .double(state == .pending ? nil : now), .int(sequence), .text(node),
            ])
    }

    public func disableWebhook(_ tx: PostgresTransaction, id: String, reason: String) throws {
        try tx.execute("UPDATE webhooks SET enabled = 0, disabled_reason = $1 WHERE id = $2", [.text(reason), .text(id)])
    }

    /// Of one state or all (`$2` NULL).
    public func deliveryRows(
        _ tx: PostgresTransaction, webhookID: String, state: DeliveryRecord.State?, after: Int64, limit: Int
    ) throws -> [DeliveryRecord] {
        try tx.rows(
            """
            \(StoreRules.deliverySelect) WHERE d.webhook_id = $1 AND ($2::text IS NULL OR d.state = $2) AND d.seq > $3
            ORDER BY d.seq LIMIT $4
            """, [.text(webhookID), .text(state?.rawValue), .int(after), .int(limit)], StoreRules.decodeDelivery)
    }
}
