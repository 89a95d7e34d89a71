import BackhaulCore
import BackhaulQueue
import JSONCodec
import SQLite

/// The engine's side of the store. Its writes are handed over without waiting (relaxed
/// durability); `done` runs after the commit, in commit order, and a write whose task
/// moved on meanwhile (cancelled, suspended, expired) changes nothing and says so with nil.
extension Store {
    /// At start: tasks left `running` by a stop or a crash go back to the queue, their attempt
    /// counted; those whose row cannot be read as it is fail (`failUnreadable`). How many went
    /// back, and the ids of those that failed.
    public func recoverInterrupted() throws(StoreError) -> (requeued: Int, failed: [String]) {
        let now = self.now
        return try write { [self] db in
            let running = try db.query("SELECT seq FROM tasks WHERE state = 'running'") { $0.int(0) }
            var failed: [String] = []
            for sequence in running {
                do {
                    guard let task = try TaskRows.fetch(db, sequence: sequence) else { continue }
                    try transition(db, task, .requeued(counted: true), now: now)
                } catch StoreError.corrupt(let message) {
                    if let id = try failUnreadable(db, sequence: sequence, message, now: now) { failed.append(id) }
                }
            }
            return (running.count - failed.count, failed)
        }
    }

    /// A running task whose row this build cannot read as it is (its checkpoint, most often) fails
    /// with -3100 `internal_error`, read without its checkpoint (which is dropped), instead of stopping the start,
    /// which every later start would meet again (docs/operations.md, "A damaged state"). A row
    /// that cannot be read even so is left as it is and named in the error thrown.
    private func failUnreadable(_ db: Connection, sequence: Int64, _ message: String, now: Timestamp) throws -> String? {
        guard let task = try TaskRows.fetch(db, sequence: sequence, ignoringCheckpoint: true) else { return nil }
        try TaskRows.dropCheckpoint(db, sequence: sequence)
        let error = TaskError.unreadableRow(message)
        let end = AttemptEnd.failed(error, nil)
        try transition(
            db, task, .attemptEnded(attempt: task.attempts, bytesTransferred: task.bytesTransferred, end), now: now)
        return task.id
    }

    /// The queue as the scheduler needs it, in pages by sequence (a read: no writer waits).
    public func queuedEntries(after sequence: Int64, limit: Int) throws(StoreError) -> [Scheduler.Entry] {
        try read { db in
            try db.query(
                """
                SELECT seq, priority, session_id, host_key,
                    CASE WHEN configuration = '{}' THEN NULL ELSE json_extract(configuration, '$.max_connections_per_host') END
                FROM tasks WHERE state = 'queued' AND waiting_reason IS NULL AND seq > ? ORDER BY seq LIMIT ?
                """, [sequence, limit], StoreRules.queueEntry)
        }
    }

    /// A task by its sequence (a read), to start it.
    public func task(sequence: Int64) throws(StoreError) -> TaskRecord? {
        try read { db in try TaskRows.fetch(db, sequence: sequence) }
    }

    /// Claims `task` (as read, or as created) for its next attempt, if it is still queued as it
    /// was; `done` gets the task as started, or nil. A task whose row changed while it waited in
    /// the queue is read again here, in the claim's transaction, and started as it is now.
    public func startAttempt(_ task: TaskRecord, done: @escaping @Sendable (Result<TaskRecord?, StoreError>) -> Void) {
        let now = self.now
        submit(
            { [self] db -> TaskRecord? in
                var current = task
                if writerState.touchedQueued.contains(task.sequence) {
                    recorder.settleTouched(task.sequence)
                    guard let read = try TaskRows.fetch(db, sequence: task.sequence), read.state == .queued else { return nil }
                    current = read
                }
                let guarded = "state = 'queued' AND attempts = \(current.attempts)"
                return try move(db, current, .attemptStarted, now: now) { started in
                    try TaskRows.update(db, from: current, to: started, onlyIf: guarded, feed: feed) ? started : nil
                }
            }, done: done)
    }

    /// Records how the engine's attempt of `task` (the record as it started) ended, with its entry
    /// in the task's history; nil when the task left that attempt meanwhile. The row is not read
    /// again unless a client changed the task while it ran: the update is guarded by the attempt.
    public func finishAttempt(
        _ task: TaskRecord, bytesTransferred: Int64, end: AttemptEnd, history: AttemptRecord,
        done: @escaping @Sendable (Result<TaskRecord?, StoreError>) -> Void
    ) {
        let now = self.now
        submit(
            { [self] db -> TaskRecord? in
                var current = task
                if writerState.patchedWhileRunning.contains(task.sequence) {
                    recorder.settlePatched(task.sequence)
                    guard let read = try TaskRows.fetch(db, sequence: task.sequence) else { return nil }
                    current = read
                }
                let ended = TaskInput.attemptEnded(attempt: task.attempts, bytesTransferred: bytesTransferred, end)
                return try move(db, current, ended, now: now) { next in
                    guard
                        try TaskRows.update(
                            db, from: current, to: next, onlyIf: "state = 'running' AND attempts = \(task.attempts)", feed: feed)
                    else { return nil }
                    try Store.appendAttempt(db, taskSequence: task.sequence, history.ended(by: end))
                    return next
                }
            }, done: done)
    }

    /// Appends an attempt to a task's history (numbered after the last one) and drops what falls
    /// beyond `AttemptRecord.historyLimit`.
    static func appendAttempt(_ db: Connection, taskSequence: Int64, _ record: AttemptRecord) throws {
        // The number read first, then a plain insert (RETURNING would go through an ephemeral table).
        let number =
            (try db.queryFirst("SELECT COALESCE(MAX(number), 0) FROM attempts WHERE task_seq = ?", [taskSequence]) {
                $0.int(0)
            } ?? 0) + 1
        try db.run(
            """
            INSERT INTO attempts (task_seq, number, started_at, ended_at, bytes_sent, bytes_received, outcome, http_status,
                error, network_type)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            [
                taskSequence, number, record.startedAt, record.endedAt, record.bytesTransferred, record.bytesReceived,
                record.outcome.rawValue, record.httpStatus ?? record.error?.httpStatus,
                record.error.map { TaskRecord.errorJSON($0).serialized() }, record.networkType?.rawValue,
            ])
        if number > Int64(AttemptRecord.historyLimit) {
            try db.run(
                "DELETE FROM attempts WHERE task_seq = ? AND number <= ?",
                [taskSequence, number - Int64(AttemptRecord.historyLimit)])
        }
    }

    /// Tasks shown running that are not in `running` (the engine's, by id) go back to the queue,
    /// their attempt not counted: their end could not be written.
    public func requeueRunning(except running: Set<String>, done: @escaping @Sendable (Result<Int, StoreError>) -> Void) {
        let now = self.now
        submit(
            { [self] db -> Int in
                let orphans = try db.query("SELECT \(TaskRows.columns) FROM tasks WHERE state = 'running'", [], TaskRows.decode)
                    .filter { !running.contains($0.id) }
                for task in orphans { try transition(db, task, .requeued(counted: false), now: now) }
                return orphans.count
            }, done: done)
    }

    /// Moves tasks whose timers have passed: retries due → queued, scheduled starts due → queued,
    /// resource deadlines passed → failed (-1001, or -1013 waiting for credentials). `done` gets
    /// how many expired and the next timer after these.
    public func fireTimers(
        now: Timestamp, done: @escaping @Sendable (Result<(expired: Int, next: Timestamp?), StoreError>) -> Void
    ) {
        submit(
            { [self] db -> (expired: Int, next: Timestamp?) in
                let due: [(String, TaskInput)] =
                    try db.query(
                        "SELECT id FROM tasks INDEXED BY tasks_retries WHERE state = 'retrying' AND next_attempt_at <= ?", [now]
                    ) {
                        ($0.string(0), .retryDue)
                    }
                    + db.query(
                        """
                        SELECT id FROM tasks INDEXED BY tasks_scheduled
                        WHERE state = 'waiting' AND waiting_reason = 'scheduled' AND earliest_begin_at <= ?
                        """,
                        [now]
                    ) { ($0.string(0), .scheduledDue) }
                for (id, input) in due { try transition(db, id: id, input, now: now) }
                let expired = try db.query(
                    "SELECT id FROM tasks WHERE deadline_at <= ? AND finished_at IS NULL AND \(StoreRules.unfinishedCondition)",
                    [now]
                ) { $0.string(0) }
                for id in expired { try transition(db, id: id, .deadlinePassed, now: now) }
                return (expired.count, try Store.nextTimer(db))
            }, done: done)
    }

    /// The earliest moment a timer of `fireTimers` is due, if any.
    public func nextTimer() throws(StoreError) -> Timestamp? {
        try read { db in try Store.nextTimer(db) }
    }

    static func nextTimer(_ db: Connection) throws -> Timestamp? {
        let retry =
            try db.queryFirst("SELECT MIN(next_attempt_at) FROM tasks INDEXED BY tasks_retries WHERE state = 'retrying'") {
                $0.optionalDouble(0)
            } ?? nil
        let scheduled =
            try db.queryFirst(
                """
                SELECT MIN(earliest_begin_at) FROM tasks INDEXED BY tasks_scheduled
                WHERE state = 'waiting' AND waiting_reason = 'scheduled'
                """
            ) {
                $0.optionalDouble(0)
            } ?? nil
        let deadline =
            try db.queryFirst(
                "SELECT MIN(deadline_at) FROM tasks WHERE finished_at IS NULL AND \(StoreRules.unfinishedCondition)"
            ) { $0.optionalDouble(0) } ?? nil
        return [retry, scheduled, deadline].compactMap { $0 }.min()
    }

    /// Tasks the policy holds (`waiting` for one of `Policy.reasons`), in creation order after
    /// `afterSequence` (a read).
    public func policyHeldTasks(afterSequence: Int64, limit: Int) throws(StoreError) -> [HeldTask] {
        let reasons = "(" + Policy.reasons.map { "'\($0.rawValue)'" }.sorted().joined(separator: ", ") + ")"
        return try read { db in
            try db.query(
                """
                SELECT seq, id, session_id, configuration, waiting_reason FROM tasks
                WHERE state = 'waiting' AND waiting_reason IN \(reasons) AND seq > ? ORDER BY seq LIMIT ?
                """, [afterSequence, limit], StoreRules.heldTask)
        }
    }
}
