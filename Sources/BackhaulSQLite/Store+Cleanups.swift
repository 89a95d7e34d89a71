import BackhaulCore
import BackhaulQueue
import JSONCodec
import SQLite

extension Store {
    /// Cleanup requests due now (tus termination, S3 abort after a cancel). A row that cannot be
    /// read comes back as a failure, for the engine to log and drop, not to skip forever.
    public func dueCleanups(now: Timestamp, limit: Int, excluding busy: Set<Int64>) throws(StoreError) -> [DueCleanup] {
        try read { db in
            try db.query(
                "SELECT seq, request, attempts, task_id FROM cleanups WHERE next_attempt_at <= ? ORDER BY seq LIMIT ?",
                [now, limit + busy.count]
            ) { row -> DueCleanup? in busy.contains(row.int(0)) ? nil : StoreRules.decodeCleanup(row) }.compactMap { $0 }.prefix(
                limit
            )
            .map { $0 }
        }
    }

    /// A cleanup whose listing found uploads to release: those no unfinished task holds go in as
    /// cleanups of their own, in the transaction that ends the listing one. Returns how many.
    @discardableResult
    public func replaceCleanup(sequence: Int64, with found: [(uploadID: String, plan: CleanupPlan)]) throws(StoreError) -> Int {
        let now = self.now
        return try write(.relaxed) { [self] db in
            let taskID = try db.queryFirst("SELECT task_id FROM cleanups WHERE seq = ?", [sequence]) { $0.string(0) } ?? ""
            var added = 0
            for (uploadID, plan) in found {
                let held =
                    try db.queryFirst(
                        """
                        SELECT 1 FROM tasks WHERE finished_at IS NULL AND \(StoreRules.unfinishedCondition) AND checkpoint IS NOT NULL
                        AND json_extract(checkpoint, '$.location') = ? LIMIT 1
                        """, [uploadID]
                    ) { _ in true } ?? false
                guard !held else { continue }
                try insertCleanup(db, taskID: taskID, plan, now: now)
                added += 1
            }
            try db.run("DELETE FROM cleanups WHERE seq = ?", [sequence])
            return added
        }
    }

    /// A cleanup succeeded or was given up (`retryAt` nil), or is tried again later.
    public func recordCleanup(sequence: Int64, retryAt: Timestamp?) throws(StoreError) {
        try write(.relaxed) { db in
            if let retryAt {
                try db.run("UPDATE cleanups SET attempts = attempts + 1, next_attempt_at = ? WHERE seq = ?", [retryAt, sequence])
            } else {
                try db.run("DELETE FROM cleanups WHERE seq = ?", [sequence])
            }
        }
    }
}
