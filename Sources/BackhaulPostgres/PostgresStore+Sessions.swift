import BackhaulCore
import BackhaulQueue
import JSONCodec
import PostgreSQL

/// Sessions (OpenAPI/backhaul.yaml), as `Store+Sessions` keeps them for SQLite. Their task counts
/// are counted from the tasks (`tasks_open` holds the unfinished ones by session and state).
extension PostgresStore {
    public func putSession(id: String, configuration: TransferConfiguration) throws(StoreError) -> (SessionRecord, Bool) {
        let now = self.now
        return try write { [self] tx in
            // Two nodes creating the same session at once: the second waits on the first's row
            // (ON CONFLICT), then finds it.
            try tx.execute(
                """
                INSERT INTO sessions (id, configuration, enabled, lifecycle, created_at) VALUES ($1, $2, 1, 'active', $3)
                ON CONFLICT (id) DO NOTHING
                """, [.text(id), .text(configuration.json.serialized()), .double(now)]
            ).affected == 1
                ? (try created(tx, id: id), true)
                : (try existing(tx, id: id, configuration: configuration), false)
        }
    }

    private func created(_ tx: PostgresTransaction, id: String) throws -> SessionRecord {
        tx.changes.sessions.insert(id)
        guard let session = try fetchSession(tx, id: id, lock: false) else { throw StoreError.notFound }
        return session
    }

    private func existing(_ tx: PostgresTransaction, id: String, configuration: TransferConfiguration) throws -> SessionRecord {
        guard let existing = try fetchSession(tx, id: id, lock: false) else { throw StoreError.notFound }
        guard existing.configuration == configuration else { throw StoreError.sessionExists }
        return existing
    }

    /// From the records kept since the last change of the session heard here or from another
    /// node (every request that creates tasks reads its session). A write that needs the session
    /// as it is (a task's admission) reads it again under its lock.
    public func sessionRecord(id: String) throws(StoreError) -> SessionRecord? {
        try SessionCache.record(sessionCache, id: id) { () throws(StoreError) in
            try read { tx in try fetchSession(tx, id: id, lock: false) }
        }
    }

    public func session(id: String) throws(StoreError) -> (SessionRecord, [TaskState: Int])? {
        try read { tx in
            guard let session = try fetchSession(tx, id: id, lock: false) else { return nil }
            return (session, try counts(tx, sessionID: id))
        }
    }

    public func sessions() throws(StoreError) -> [(SessionRecord, [TaskState: Int])] {
        try read { tx in
            let sessions = try tx.rows("SELECT \(Self.sessionColumns) FROM sessions ORDER BY id", [], StoreRules.decodeSession)
            return try sessions.map { ($0, try counts(tx, sessionID: $0.id)) }
        }
    }

    public func sessionConfigurations() throws(StoreError) -> [String: TransferConfiguration] {
        try read { tx in
            var result: [String: TransferConfiguration] = [:]
            for session in try tx.rows("SELECT \(Self.sessionColumns) FROM sessions", [], StoreRules.decodeSession) {
                result[session.id] = session.configuration
            }
            return result
        }
    }
}
