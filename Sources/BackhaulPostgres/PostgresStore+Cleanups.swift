import BackhaulCore
import BackhaulQueue
import PostgreSQL

/// Server-side releases of cancelled tasks (tus termination, S3 abort), as `Store+Cleanups` keeps
/// them for SQLite. A node claims the cleanups it is about to run for a lease, as it claims
/// deliveries (`PostgresStore+Webhooks`), so that one node at a time sends each; a stopped node's
/// claims run out and another node runs them.
extension PostgresStore {
    /// Claims the cleanups due now for this node, oldest first, leaving out those under way here
    /// (whose claims are renewed), and returns them. A row that cannot be read comes back as a
    /// failure, for the engine to log and drop, not to skip forever.
    public func dueCleanups(now: Timestamp, limit: Int, excluding busy: Set<Int64>) throws(StoreError) -> [DueCleanup] {
        let busyArray = PostgresValue.array(busy.sorted())
        return try write(fenced: true) { [self] tx in
            let lease = PostgresValue.double(options.leaseSeconds)
            if !busy.isEmpty {
                try tx.execute(
                    """
                    UPDATE cleanups SET claim_expires_at = clock_timestamp() + make_interval(secs => $3)
                    WHERE seq = ANY($1::bigint[]) AND claimed_by = $2
                    """, [busyArray, .text(node), lease])
            }
            guard limit > 0 else { return [] }
            let claimed = try tx.rows(
                """
                UPDATE cleanups SET claimed_by = $2, claim_expires_at = clock_timestamp() + make_interval(secs => $5)
                WHERE seq IN (
                    SELECT seq FROM cleanups
                    WHERE next_attempt_at <= $1 AND NOT (seq = ANY($3::bigint[]))
                        AND (claimed_by IS NULL OR claimed_by = $2 OR claim_expires_at <= clock_timestamp())
                    ORDER BY seq LIMIT $4
                    FOR UPDATE SKIP LOCKED)
                RETURNING seq, request, attempts, task_id
                """, [.double(now), .text(node), busyArray, .int(limit), lease], StoreRules.decodeCleanup)
            return claimed.sorted { $0.sequence < $1.sequence }
        }
    }

    /// A cleanup whose listing found uploads to release: those no unfinished task holds go in as
    /// cleanups of their own, in the transaction that ends the listing one. Returns how many.
    @discardableResult
    public func replaceCleanup(sequence: Int64, with found: [(uploadID: String, plan: CleanupPlan)]) throws(StoreError) -> Int {
        let now = self.now
        return try write(fenced: true) { [self] tx in
            let taskID =
                try tx.first("SELECT task_id FROM cleanups WHERE seq = $1 FOR UPDATE", [.int(sequence)]) { $0.string(0) } ?? ""
            var added = 0
            for (uploadID, plan) in found {
                let held =
                    try tx.first(
                        """
                        SELECT 1 FROM tasks WHERE finished_at IS NULL AND \(StoreRules.unfinishedCondition) AND checkpoint IS NOT NULL
                            AND checkpoint::jsonb ->> 'location' = $1 LIMIT 1
                        """, [.text(uploadID)]
                    ) { _ in true } ?? false
                guard !held else { continue }
                try insertCleanup(tx, taskID: taskID, plan, now: now)
                added += 1
            }
            try tx.execute("DELETE FROM cleanups WHERE seq = $1", [.int(sequence)])
            return added
        }
    }

    /// A cleanup succeeded or was given up (`retryAt` nil), or is tried again later (by any node:
    /// the claim ends).
    public func recordCleanup(sequence: Int64, retryAt: Timestamp?) throws(StoreError) {
        try write(fenced: true) { tx in
            if let retryAt {
                try tx.execute(
                    """
                    UPDATE cleanups SET attempts = attempts + 1, next_attempt_at = $1, claimed_by = NULL, claim_expires_at = NULL
                    WHERE seq = $2
                    """, [.double(retryAt), .int(sequence)])
            } else {
                try tx.execute("DELETE FROM cleanups WHERE seq = $1", [.int(sequence)])
            }
        }
    }
}
