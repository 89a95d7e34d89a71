import BackhaulQueue
import SQLite

extension StoreWriter {
    /// Writes the transaction's changes of the per-session task counts: one upsert per session
    /// and state it touched, instead of two statements per task change.
    func flushCounts() throws {
        for (session, states) in recorder.takeCounts() {
            for (state, delta) in states where delta != 0 {
                try connection.run(
                    """
                    INSERT INTO session_counts (session_id, state, count) VALUES (?, ?, ?)
                    ON CONFLICT (session_id, state) DO UPDATE SET count = count + excluded.count
                    """, [session, state, delta])
            }
        }
    }
}
