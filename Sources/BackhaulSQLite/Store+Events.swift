import BackhaulCore
import BackhaulQueue
import JSONCodec
import SQLite

extension Store {
    /// The newest event's sequence (0 when there is none).
    public func lastEventSequence() throws(StoreError) -> Int64 {
        try read { db in try db.queryFirst("SELECT COALESCE(MAX(seq), 0) FROM events") { $0.int(0) } ?? 0 }
    }

    /// Events after `sequence`, oldest first: of one session, of the sessions `sessions` allows
    /// (a client token's scope), or all.
    public func events(
        after sequence: Int64, session: String? = nil, limit: Int = 500,
        sessions allowed: (@Sendable (String) -> Bool)? = nil
    ) throws(StoreError) -> [EventRecord] {
        try read { db in
            let select = "SELECT \(StoreRules.eventColumns) FROM events"
            if let session {
                return try db.query(
                    "\(select) WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?", [session, sequence, limit],
                    StoreRules.decodeEvent)
            }
            guard let allowed else {
                return try db.query("\(select) WHERE seq > ? ORDER BY seq LIMIT ?", [sequence, limit], StoreRules.decodeEvent)
            }
            return try StoreRules.events(after: sequence, limit: limit, allowed: allowed) { cursor in
                try db.query("\(select) WHERE seq > ? ORDER BY seq LIMIT ?", [cursor, limit], StoreRules.decodeEvent)
            }
        }
    }
}
