import BackhaulCore
import BackhaulQueue
import JSONCodec
import SQLite

/// The tasks as clients see and change them (OpenAPI/backhaul.yaml).
extension Store {
    /// Inserts tasks all-or-nothing; a task whose idempotency key exists returns the first task.
    /// Each result says whether it was created. At most `maxOpen` unfinished tasks may be in the
    /// session afterwards (else `StoreError.tooManyTasks`), counted inside the transaction, so
    /// concurrent creates cannot pass the limit together. Durable when it returns.
    public func createTasks(sessionID: String, _ tasks: [TaskRecord], maxOpen: Int = .max) throws(StoreError) -> [(
        TaskRecord, Bool
    )] {
        try createTasks(sessionID: sessionID, TaskBatch(tasks), maxOpen: maxOpen).wait()
    }

    /// The same for a batch whose parts the API is still adding: the writer inserts each part as
    /// it comes (`TaskBatch`). Returns at once; the write's result, once waited for, is durable.
    public func createTasks(sessionID: String, _ batch: TaskBatch, maxOpen: Int = .max) -> PendingWrite<[(TaskRecord, Bool)]> {
        let now = self.now
        return writer.begin(
            durable: true,
            { [self] db, _ in
                batch.beginRun()
                var admission = try openAdmission(db, sessionID: sessionID, adding: batch.count, maxOpen: maxOpen)
                // The parts come while the API validates them. If it gives up on the batch (a task
                // failed validation, a part did not come), what this job inserted is undone alone:
                // the other writes of the transaction stand, and none is run again. (A batch that
                // came whole cannot stop half-way: no savepoint.)
                let mark = recorder.mark
                return try batch.insertParts(
                    run: { try db.run($0) }, undo: { recorder.rollBack(to: mark) },
                    admit: { part in try admit(part, &admission, db, now: now) })
            }, ended: { batch.end() })
    }

    public func task(id: String) throws(StoreError) -> TaskRecord? {
        try read { db in try TaskRows.fetch(db, id: id) }
    }

    /// A session's tasks in creation order, after `cursor`, optionally of one state.
    public func tasks(sessionID: String, state: TaskState?, cursor: String?, limit: Int) throws(StoreError) -> TaskPage {
        let after = cursor.flatMap { Int64($0) } ?? 0
        return try read { db in
            let rows: [TaskRecord]
            if let state {
                // An unfinished state is found among the session's unfinished tasks (`tasks_open`); a
                // final one by reading the session's tasks in order.
                let open = state.isFinal ? "" : "AND finished_at IS NULL "
                rows = try db.query(
                    "SELECT \(TaskRows.columns) FROM tasks WHERE session_id = ? \(open)AND state = ? AND seq > ? ORDER BY seq LIMIT ?",
                    [sessionID, state.rawValue, after, limit + 1], TaskRows.decode)
            } else {
                rows = try db.query(
                    "SELECT \(TaskRows.columns) FROM tasks WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    [sessionID, after, limit + 1], TaskRows.decode)
            }
            return TaskPage(reading: rows, limit: limit)
        }
    }

    /// Deletes a finished task's record, its events and its attempt history.
    public func deleteTask(id: String) throws(StoreError) {
        try write { [self] db in
            guard let task = try TaskRows.fetch(db, id: id) else { throw StoreError.notFound }
            guard task.state.isFinal else {
                throw StoreError.conflict("only finished tasks can be deleted; cancel it first")
            }
            try deleteFinished(db, sequences: [task.sequence], ids: [task.id])
        }
    }

    /// Counts of waiting tasks by reason (metrics).
    public func waitingCounts() throws(StoreError) -> [WaitingReason: Int] {
        try read { db in
            try StoreRules.counts(
                db.query(
                    "SELECT waiting_reason, COUNT(*) FROM tasks WHERE state = 'waiting' GROUP BY waiting_reason", [],
                    { ($0.optionalString(0) ?? "", Int($0.int(1))) }))
        }
    }

    /// Counts of tasks by state, over all sessions and tasks whose session is gone (metrics, info).
    public func taskCounts() throws(StoreError) -> [TaskState: Int] {
        // From the per-session counts, plus the tasks whose session was removed (an index range):
        // no walk over every task.
        try read { db in
            try StoreRules.counts(
                try db.query(
                    """
                    SELECT state, SUM(count) FROM session_counts GROUP BY state
                    UNION ALL SELECT state, COUNT(*) FROM tasks WHERE session_id = '' GROUP BY state
                    """, [], { ($0.string(0), Int($0.int(1))) }), unknown: StoreRules.unknownState)
        }
    }
}
