import BackhaulCore
import BackhaulQueue
import JSONCodec
import SQLite
import Threads

/// Sessions (OpenAPI/backhaul.yaml): records, their task counts (kept by the writer from `TaskFeed`), changes.
extension Store {
    /// The unfinished tasks of the session bound first, found through the partial index
    /// `tasks_open` (`finished_at` is set exactly when a task ends).
    static let openInSession = "session_id = ? AND finished_at IS NULL AND \(StoreRules.unfinishedCondition)"

    static func fetchSession(_ db: Connection, id: String) throws -> SessionRecord? {
        try db.queryFirst(
            "SELECT id, configuration, enabled, lifecycle, created_at FROM sessions WHERE id = ?", [id], StoreRules.decodeSession)
    }

    public func saveSession(_ db: Connection, _ session: SessionRecord) throws {
        try db.run(
            """
            INSERT INTO sessions (id, configuration, enabled, lifecycle, created_at) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (id) DO UPDATE SET configuration = excluded.configuration, enabled = excluded.enabled,
                lifecycle = excluded.lifecycle
            """,
            [session.id, session.configuration.json.serialized(), session.enabled, session.lifecycle.rawValue, session.createdAt])
        recorder.update { $0.sessions.insert(session.id) }
    }

    /// The session's tasks by state, with what the open transaction changed (on the writer).
    public func counts(_ db: Connection, sessionID: String) throws -> [TaskState: Int] {
        var counts = try Store.counts(db, sessionID: sessionID)
        for (name, delta) in recorder.pendingCounts(sessionID) {
            guard let state = TaskState(rawValue: name) else { continue }
            counts[state, default: 0] += delta
            if counts[state] == 0 { counts[state] = nil }
        }
        return counts
    }

    /// The session's unfinished tasks, with what the open transaction changed (on the writer).
    func openTaskCount(_ db: Connection, sessionID: String) throws -> Int {
        try recorder.openCount(sessionID) { try Store.openTaskCount(db, sessionID: sessionID) }
    }

    /// The session's tasks by state, as committed in `session_counts`.
    static func counts(_ db: Connection, sessionID: String) throws -> [TaskState: Int] {
        var counts: [TaskState: Int] = [:]
        for (name, count) in try db.query(
            "SELECT state, count FROM session_counts WHERE session_id = ? AND count != 0", [sessionID],
            { ($0.string(0), Int($0.int(1))) })
        {
            guard let state = TaskState(rawValue: name) else {
                throw StoreError.corrupt("session \(sessionID) counts tasks in the state \(name)")
            }
            counts[state] = count
        }
        return counts
    }

    /// The session's unfinished tasks, counted without walking them.
    static func openTaskCount(_ db: Connection, sessionID: String) throws -> Int {
        Int(
            try db.queryFirst(
                "SELECT COALESCE(SUM(count), 0) FROM session_counts WHERE session_id = ? AND \(StoreRules.unfinishedCondition)",
                [sessionID]
            ) { $0.int(0) } ?? 0)
    }

    /// Removes the session's record. Its tasks (all final by now) stay readable by id for their
    /// retention (OpenAPI/backhaul.yaml), detached: they belong to no session (`session_id` ''), remember the
    /// one they had, and leave the id and their idempotency keys free for a new session.
    public func removeSession(_ db: Connection, id: String) throws {
        try TaskRows.detach(db, session: id, feed: feed)
        try db.run("DELETE FROM session_counts WHERE session_id = ?", [id])
        try db.run("DELETE FROM sessions WHERE id = ?", [id])
        recorder.update { $0.sessions.insert(id) }
    }

    /// PUT: creates the session (true) or returns the existing one if its configuration is equal (false).
    public func putSession(id: String, configuration: TransferConfiguration) throws(StoreError) -> (SessionRecord, Bool) {
        let now = self.now
        return try write { [self] db in
            if let existing = try Store.fetchSession(db, id: id) {
                guard existing.configuration == configuration else { throw StoreError.sessionExists }
                return (existing, false)
            }
            let session = SessionRecord(id: id, configuration: configuration, createdAt: now)
            try saveSession(db, session)
            return (session, true)
        }
    }

    /// A session without its task counts (creating tasks needs no counts), from the cache of
    /// committed records when it is there (`SessionCache`).
    public func sessionRecord(id: String) throws(StoreError) -> SessionRecord? {
        try SessionCache.record(sessionCache, id: id) { () throws(StoreError) in
            try read { db in try Store.fetchSession(db, id: id) }
        }
    }

    public func session(id: String) throws(StoreError) -> (SessionRecord, [TaskState: Int])? {
        try read { db in
            guard let session = try Store.fetchSession(db, id: id) else { return nil }
            return (session, try Store.counts(db, sessionID: id))
        }
    }

    public func sessions() throws(StoreError) -> [(SessionRecord, [TaskState: Int])] {
        try read { db in
            let sessions = try db.query(
                "SELECT id, configuration, enabled, lifecycle, created_at FROM sessions ORDER BY id", [],
                StoreRules.decodeSession)
            return try sessions.map { ($0, try Store.counts(db, sessionID: $0.id)) }
        }
    }

    /// Every session's configuration (the engine keeps them to decide for tasks).
    public func sessionConfigurations() throws(StoreError) -> [String: TransferConfiguration] {
        try read { db in
            var result: [String: TransferConfiguration] = [:]
            for session in try db.query(
                "SELECT id, configuration, enabled, lifecycle, created_at FROM sessions", [], StoreRules.decodeSession)
            {
                result[session.id] = session.configuration
            }
            return result
        }
    }
}
