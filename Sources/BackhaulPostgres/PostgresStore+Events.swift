import BackhaulCore
import BackhaulQueue
import PostgreSQL

/// The event log, as `Store+Events` reads it for SQLite. Events are appended under the events'
/// lock at the end of each transaction (`PostgresWriter`), so their sequence is their commit order
/// and a reader resuming after a sequence never skips one committed later on another node.
extension PostgresStore {
    /// The newest event's sequence (0 when there is none).
    public func lastEventSequence() throws(StoreError) -> Int64 {
        try read { tx in try tx.first("SELECT COALESCE(max(seq), 0) FROM events") { $0.int(0) } ?? 0 }
    }

    /// Events after `sequence`, oldest first: of one session, of the sessions `sessions` allows
    /// (a client token's scope), or all.
    public func events(
        after sequence: Int64, session: String?, limit: Int, sessions allowed: (@Sendable (String) -> Bool)?
    ) throws(StoreError) -> [EventRecord] {
        try read { tx in
            let select = "SELECT \(StoreRules.eventColumns) FROM events"
            if let session {
                return try tx.rows(
                    "\(select) WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                    [.text(session), .int(sequence), .int(limit)], StoreRules.decodeEvent)
            }
            guard let allowed else {
                return try tx.rows(
                    "\(select) WHERE seq > $1 ORDER BY seq LIMIT $2", [.int(sequence), .int(limit)], StoreRules.decodeEvent)
            }
            return try StoreRules.events(after: sequence, limit: limit, allowed: allowed) { cursor in
                try tx.rows(
                    "\(select) WHERE seq > $1 ORDER BY seq LIMIT $2", [.int(cursor), .int(limit)], StoreRules.decodeEvent)
            }
        }
    }
}
