import BackhaulCore
import BackhaulQueue
import PostgreSQL

/// Retention, as `Store+Maintenance` keeps it for SQLite: finished tasks past their retention go
/// with their events and deliveries, and the event log is trimmed. Every node's housekeeper may
/// run these; the rows one node is deleting are skipped by another (`SKIP LOCKED`) or found gone.
/// Free space is PostgreSQL's own business (autovacuum).
extension PostgresStore {
    /// A session's `finished_task_retention`, NULL when it has none.
    static let sessionRetention = "(s.configuration::jsonb ->> 'finished_task_retention')::double precision"

    /// Removes finished tasks kept longer than their retention (the session's
    /// `finished_task_retention`, else `defaultRetention`), counted from `finished_at`, whose
    /// events have no delivery still pending; with them go their events, deliveries and attempt
    /// history. At most `batch` tasks per call (one short transaction); returns how many went.
    public func pruneFinishedTasks(defaultRetention: Double, batch: Int) throws(StoreError) -> Int {
        let now = self.now
        let (tasks, events) = try write { [self] tx in
            let cutoff = now - (try shortestRetention(tx, defaultRetention: defaultRetention))
            let due = try tx.rows(
                """
                SELECT t.seq FROM tasks t LEFT JOIN sessions s ON s.id = t.session_id
                WHERE t.finished_at IS NOT NULL AND (t.state = 'completed' OR t.state = 'failed' OR t.state = 'cancelled')
                    AND t.finished_at < $1 AND t.finished_at < $2 - COALESCE(\(Self.sessionRetention), $3)
                    AND NOT EXISTS (SELECT 1 FROM events e WHERE e.task_id = t.id
                                    AND EXISTS (SELECT 1 FROM deliveries d WHERE d.event_seq = e.seq AND d.state = 'pending'))
                ORDER BY t.finished_at LIMIT $4
                FOR UPDATE OF t SKIP LOCKED
                """, [.double(cutoff), .double(now), .double(defaultRetention), .int(batch)]
            ) { $0.int(0) }
            return try PostgresTaskRows.deleteFinished(tx, sequences: due)
        }
        figures.withLock {
            $0.tasksPruned += tasks
            $0.eventsPruned += events
        }
        return tasks
    }

    /// The shortest retention in force: the daemon's, or a session's own if shorter.
    public func shortestRetention(defaultRetention: Double) throws(StoreError) -> Double {
        try read { [self] tx in try shortestRetention(tx, defaultRetention: defaultRetention) }
    }

    func shortestRetention(_ tx: PostgresTransaction, defaultRetention: Double) throws -> Double {
        let shortest = try tx.first("SELECT min(\(Self.sessionRetention)) FROM sessions s") { $0.optionalDouble(0) } ?? nil
        return min(defaultRetention, shortest ?? defaultRetention)
    }

    /// Drops what is older than `retention` and no longer needed: events of tasks still kept, and
    /// session events, that no pending delivery refers to; finished deliveries; subscriptions of
    /// removed sessions with nothing pending. At most `batch` rows of each per call.
    public func pruneEventLog(olderThan retention: Double, batch: Int) throws(StoreError) -> Int {
        let now = self.now
        let cutoff = now - retention
        let events = try write { tx in
            try tx.execute(
                """
                DELETE FROM deliveries WHERE seq IN
                    (SELECT seq FROM deliveries WHERE state != 'pending' AND created_at < $1 LIMIT $2)
                """, [.double(cutoff), .int(batch)])
            // Events are appended in commit order, so the old ones come first by seq: the sweep
            // reads the first `batch` events that no pending delivery pins and takes the old ones up
            // to the first event young enough to keep. An event dated after now (a node whose clock
            // is ahead wrote it) neither goes nor stops the sweep; one dated before its neighbours
            // waits until those before it go.
            let window = try tx.rows(
                """
                SELECT seq, created_at FROM events e
                WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_seq = e.seq AND d.state = 'pending')
                ORDER BY seq LIMIT $1
                """, [.int(batch)]
            ) { ($0.int(0), $0.double(1)) }
            var old: [Int64] = []
            for (sequence, createdAt) in window {
                if createdAt < cutoff {
                    old.append(sequence)
                } else if createdAt <= now {
                    break
                }
            }
            let events =
                old.isEmpty
                ? 0 : try tx.execute("DELETE FROM events WHERE seq = ANY($1::bigint[])", [.array(old)]).affected
            try tx.execute(
                """
                DELETE FROM webhooks WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = webhooks.session_id)
                    AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.webhook_id = webhooks.id AND d.state = 'pending')
                """)
            return events
        }
        figures.withLock { $0.eventsPruned += events }
        return events
    }

    /// PostgreSQL's autovacuum returns free space; there is nothing for a node to do.
    public func vacuumFreePages(_ pages: Int) throws(StoreError) -> Int { 0 }

    /// How long ago the oldest finished task still kept finished (nil: none), for `/metrics`.
    public func oldestFinishedTask(now: Timestamp) throws(StoreError) -> Double? {
        try read { tx in
            try tx.first("SELECT min(finished_at) FROM tasks WHERE finished_at IS NOT NULL AND \(StoreRules.finalCondition)") {
                $0.optionalDouble(0)
            }?.map { now - $0 }
        }
    }
}
