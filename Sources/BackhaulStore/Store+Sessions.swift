import BackhaulCore
import JSON
import SQLite

extension Store {
    /// The unfinished states as an SQL list, for index seeks.
    static let unfinishedStates = "(" + TaskState.unfinished.map { "'\($0.rawValue)'" }.joined(separator: ", ") + ")"

    static func fetchSession(_ db: Connection, id: String) throws -> SessionRecord? {
        try db.queryFirst("SELECT id, configuration, enabled, lifecycle, created_at FROM sessions WHERE id = ?", [id], decodeSession)
    }

    static func decodeSession(_ row: Row) throws -> SessionRecord {
        let configuration = try TransferConfiguration().applying(JSON.parse(row.string(1), maxDepth: 64))
        return SessionRecord(id: row.string(0), configuration: configuration, enabled: row.int(2) != 0,
                             lifecycle: SessionRecord.Lifecycle(rawValue: row.string(3)) ?? .active, createdAt: row.double(4))
    }

    static func saveSession(_ db: Connection, _ session: SessionRecord) throws {
        try db.run(
            """
            INSERT INTO sessions (id, configuration, enabled, lifecycle, created_at) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (id) DO UPDATE SET configuration = excluded.configuration, enabled = excluded.enabled,
                lifecycle = excluded.lifecycle
            """,
            [session.id, session.configuration.json.serialized(), session.enabled, session.lifecycle.rawValue, session.createdAt])
    }

    static func counts(_ db: Connection, sessionID: String) throws -> [TaskState: Int] {
        var counts: [TaskState: Int] = [:]
        for (state, count) in try db.query(
            "SELECT state, COUNT(*) FROM tasks WHERE session_id = ? GROUP BY state", [sessionID], { ($0.string(0), Int($0.int(1))) })
        {
            if let state = TaskState(rawValue: state) { counts[state] = count }
        }
        return counts
    }

    /// After a task of the session finished: `session.drained` when nothing is left to do, and
    /// a finishing session's record goes.
    static func sessionTaskReachedFinalState(_ db: Connection, sessionID: String, now: Timestamp) throws {
        // Existence, by index seeks on (session_id, state): not a walk over the session's tasks.
        let anyUnfinished = try db.queryFirst(
            "SELECT 1 FROM tasks WHERE session_id = ? AND state IN \(Store.unfinishedStates) LIMIT 1", [sessionID]) { _ in true }
        guard anyUnfinished == nil else { return }
        var summary = JSONObject()
        for (state, count) in try counts(db, sessionID: sessionID) { summary[state.rawValue] = .int(Int64(count)) }
        try appendEvent(db, type: "session.drained", sessionID: sessionID, task: nil,
                        data: ["session_id": .string(sessionID), "task_counts": .object(summary)], now: now)
        if let session = try fetchSession(db, id: sessionID), session.lifecycle == .finishing {
            try removeSession(db, id: sessionID)
        }
    }

    static func removeSession(_ db: Connection, id: String) throws {
        try db.run("DELETE FROM tasks WHERE session_id = ?", [id])
        try db.run("DELETE FROM sessions WHERE id = ?", [id])
    }

    /// PUT: creates the session (true) or returns the existing one if its configuration is equal (false).
    public func putSession(id: String, configuration: TransferConfiguration) throws(StoreError) -> (SessionRecord, Bool) {
        let now = self.now
        return try write { db in
            if let existing = try Store.fetchSession(db, id: id) {
                guard existing.configuration == configuration else { throw StoreError.sessionExists }
                return (existing, false)
            }
            let session = SessionRecord(id: id, configuration: configuration, createdAt: now)
            try Store.saveSession(db, session)
            return (session, true)
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
            let sessions = try db.query("SELECT id, configuration, enabled, lifecycle, created_at FROM sessions ORDER BY id", [],
                                        Store.decodeSession)
            return try sessions.map { ($0, try Store.counts(db, sessionID: $0.id)) }
        }
    }

    /// PATCH: a new configuration and/or enabled flag. Disabling holds the session's tasks
    /// (`waiting`, `session_disabled`), or cancels them with reason 1 when `cancelPending`.
    public func updateSession(id: String, configuration: TransferConfiguration?, enabled: Bool?,
                              cancelPending: Bool) throws(StoreError) -> (SessionRecord, [TaskState: Int]) {
        let now = self.now
        return try write { db in
            guard var session = try Store.fetchSession(db, id: id) else { throw StoreError.notFound }
            if let configuration { session.configuration = configuration }
            if let enabled { session.enabled = enabled }
            try Store.saveSession(db, session)
            let unfinished = try db.query(
                "SELECT id FROM tasks WHERE session_id = ? AND state IN \(Store.unfinishedStates) ORDER BY seq",
                [id]) { $0.string(0) }
            for taskID in unfinished {
                _ = try Store.mutate(db, id: taskID, now: now) { task in
                    if cancelPending {
                        Store.cancel(&task, reason: .backgroundUpdatesDisabled, now: now,
                                     message: "cancelled: transfers were disabled for the session")
                    } else if !session.enabled, [.queued, .running, .retrying].contains(task.state) {
                        Store.enter(.waiting, task: &task, now: now, waitingReason: .sessionDisabled)
                    } else if session.enabled, task.state == .waiting, task.waitingReason == .sessionDisabled {
                        Store.enter(.queued, task: &task, now: now)
                    }
                }
            }
            guard let updated = try Store.fetchSession(db, id: id) else { return (session, [:]) }
            return (updated, try Store.counts(db, sessionID: id))
        }
    }

    /// DELETE ?mode=finish: refuse new tasks, let the rest finish, remove the record when empty.
    /// DELETE ?mode=cancel: cancel every unfinished task (reason 0) and remove the record now.
    /// Returns true when the record is already gone.
    public func deleteSession(id: String, cancel: Bool) throws(StoreError) -> Bool {
        let now = self.now
        return try write { db in
            guard var session = try Store.fetchSession(db, id: id) else { throw StoreError.notFound }
            session.lifecycle = .finishing
            try Store.saveSession(db, session)
            let unfinished = try db.query(
                "SELECT id FROM tasks WHERE session_id = ? AND state IN \(Store.unfinishedStates) ORDER BY seq",
                [id]) { $0.string(0) }
            if cancel {
                for taskID in unfinished {
                    _ = try Store.mutate(db, id: taskID, now: now) { task in
                        Store.cancel(&task, reason: .userCancelled, now: now, message: "cancelled: the session was deleted")
                    }
                }
            }
            if cancel || unfinished.isEmpty {
                try Store.removeSession(db, id: id)
                return true
            }
            return false
        }
    }
}
