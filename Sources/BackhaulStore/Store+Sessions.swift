import BackhaulCore
import JSONCodec
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

    /// The session's tasks by state, from the counts the schema's triggers keep.
    static func counts(_ db: Connection, sessionID: String) throws -> [TaskState: Int] {
        var counts: [TaskState: Int] = [:]
        for (name, count) in try db.query(
            "SELECT state, count FROM session_counts WHERE session_id = ? AND count != 0", [sessionID], { ($0.string(0), Int($0.int(1))) })
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
        Int(try db.queryFirst(
            "SELECT COALESCE(SUM(count), 0) FROM session_counts WHERE session_id = ? AND state IN \(Store.unfinishedStates)",
            [sessionID]) { $0.int(0) } ?? 0)
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

    /// Removes the session's record. Its tasks (all final by now) stay readable by id for their
    /// retention (SPEC §4.2), detached: they belong to no session (`session_id` ''), remember the
    /// one they had, and leave the id and their idempotency keys free for a new session.
    static func removeSession(_ db: Connection, id: String) throws {
        try db.run("UPDATE tasks SET detached_from = session_id, session_id = '' WHERE session_id = ?", [id])
        try db.run("DELETE FROM session_counts WHERE session_id = ?", [id])
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

    /// PATCH: `change` gets the stored session and returns the new configuration and/or enabled
    /// flag, inside the write transaction, so two concurrent PATCHes cannot lose each other's
    /// members. A configuration that an unfinished task's own overrides cannot be applied over is
    /// refused naming the tasks (StoreError.invalid): a task never silently loses a restriction.
    /// Disabling holds the session's tasks (`waiting`, `session_disabled`), or cancels them with
    /// reason 1 when `cancelPending`.
    public func updateSession(
        id: String, cancelPending: Bool,
        _ change: @Sendable (SessionRecord) throws -> (configuration: TransferConfiguration?, enabled: Bool?)
    ) throws(StoreError) -> (SessionRecord, [TaskState: Int]) {
        let now = self.now
        return try write { db in
            guard var session = try Store.fetchSession(db, id: id) else { throw StoreError.notFound }
            let (configuration, enabled) = try change(session)
            if let configuration, configuration != session.configuration {
                try Store.checkOverrides(db, sessionID: id, against: configuration)
                session.configuration = configuration
            }
            let enabling = enabled.map { $0 != session.enabled } ?? false
            if let enabled { session.enabled = enabled }
            try Store.saveSession(db, session)
            if enabling || cancelPending {
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
            }
            guard let updated = try Store.fetchSession(db, id: id) else { return (session, [:]) }
            return (updated, try Store.counts(db, sessionID: id))
        }
    }

    /// Every unfinished task of the session with overrides of its own must still be able to apply
    /// them over `configuration`; otherwise a ValidationError names the tasks (the first 10).
    static func checkOverrides(_ db: Connection, sessionID: String, against configuration: TransferConfiguration) throws {
        let rows = try db.query(
            """
            SELECT id, configuration FROM tasks
            WHERE session_id = ? AND state IN \(Store.unfinishedStates) AND configuration != '{}' ORDER BY seq
            """, [sessionID]) { ($0.string(0), $0.string(1)) }
        var refused: [String] = []
        var reason = ""
        for (taskID, overrides) in rows {
            do {
                _ = try configuration.applying(try JSON.parse(overrides, maxDepth: 64))
            } catch let error as ValidationError {
                if refused.isEmpty { reason = error.description }
                refused.append(taskID)
            }
        }
        guard !refused.isEmpty else { return }
        let named = refused.prefix(10).joined(separator: ", ") + (refused.count > 10 ? " and \(refused.count - 10) more" : "")
        throw ValidationError("configuration", "cannot be applied under the own configuration of task(s) \(named) (\(reason)); "
                              + "PATCH or cancel those tasks first")
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
