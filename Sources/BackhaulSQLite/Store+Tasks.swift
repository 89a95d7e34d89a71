import BackhaulCore
import BackhaulStore
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
                guard let session = try Store.fetchSession(db, id: sessionID) else { throw StoreError.notFound }
                guard session.lifecycle == .active else {
                    throw StoreError.conflict("the session is finishing and accepts no new tasks")
                }
                if maxOpen < .max {
                    let open = try openTaskCount(db, sessionID: sessionID)
                    if open + batch.count > maxOpen { throw StoreError.tooManyTasks(open: open, limit: maxOpen) }
                }
                var admission = try Admission(db, session: session)
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

    /// What admitting a batch's tasks carries from one task to the next: its session, the
    /// idempotency keys the batch used, the bytes the session's unfinished tasks hold, and the
    /// sequence the next new task gets.
    struct Admission {
        let session: SessionRecord
        var keys: [String: TaskRecord] = [:]
        /// Counted only when the session has a quota.
        var held: Int64 = 0
        /// Past every task there is and ever was, as the table's autoincrement would number it:
        /// the writer numbers new tasks itself, so that it can write them many rows a statement.
        var nextSequence: Int64

        init(_ db: Connection, session: SessionRecord) throws {
            self.session = session
            if session.configuration.quotaBytes != nil {
                held =
                    try db.queryFirst(
                        "SELECT COALESCE(SUM(file_size), 0) FROM tasks WHERE \(Store.openInSession)", [session.id]
                    ) { $0.int(0) } ?? 0
            }
            nextSequence =
                try db.queryFirst(
                    """
                    SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'tasks'), 0),
                        COALESCE((SELECT MAX(seq) FROM tasks), 0)) + 1
                    """
                ) { $0.int(0) } ?? 1
        }
    }

    /// Admits a part of a batch. Each task is decided in order: one its idempotency key names
    /// already is given back (not created); a new one is numbered and kept, and the kept ones are
    /// written together (`TaskRows.insert`), then their events (a new task that has not ended has
    /// one at most: `task.waiting` in a disabled session). A task the session's quota refuses is
    /// created cancelled, which may drain the session: the tasks before it are written first and it
    /// alone after them, so the events stay in the tasks' order. `part.waitingJSON`, the API's
    /// rendering of each task as created waiting, is its event's data and its answer when it is
    /// created that way.
    func admit(_ part: TaskBatch.Part, _ admission: inout Admission, _ db: Connection, now: Timestamp) throws
        -> [TaskBatch.Inserted]
    {
        let session = admission.session
        var results: [TaskBatch.Inserted] = []
        results.reserveCapacity(part.tasks.count)
        /// Where in `results` the new tasks not yet written are.
        var kept: [Int] = []
        func writeKept() throws {
            guard !kept.isEmpty else { return }
            try TaskRows.insert(db, kept.lazy.map { results[$0].task }, feed: feed)
            var events: [NewEvent] = []
            for position in kept {
                let (task, _, rendered) = results[position]
                if let type = TaskTransition.event(from: nil, to: task) {
                    events.append(NewEvent(type: type.rawValue, taskID: task.id, data: rendered ?? task.jsonText()))
                }
            }
            try appendEvents(db, sessionID: session.id, events, now: now)
            let queued = kept.lazy.map { results[$0].task }.filter { $0.state == .queued }
            if !queued.isEmpty { recorder.update { $0.created += queued } }
            kept.removeAll()
        }
        for (offset, draft) in part.tasks.enumerated() {
            if let key = draft.idempotencyKey {
                if let existing = admission.keys[key] {
                    results.append((existing, false, nil))
                    continue
                }
                if let existing = try db.queryFirst(
                    "SELECT \(TaskRows.columns) FROM tasks WHERE session_id = ? AND idempotency_key = ? AND detached_from IS NULL",
                    [session.id, key], TaskRows.decode)
                {
                    results.append((existing, false, nil))
                    continue
                }
            }
            var refusal: String?
            if let quota = session.configuration.quotaBytes, admission.held + draft.file.size > quota {
                // The session's quota cannot keep it: it ends at once, and says why.
                refusal = "cancelled: the session's quota_bytes (\(quota)) cannot hold \(draft.file.size) more bytes"
            }
            var task = draft.admitted(sessionEnabled: session.enabled, quotaRefusal: refusal, now: now)
            task.sequence = admission.nextSequence
            admission.nextSequence += 1
            if !task.state.isFinal { admission.held += task.file.size }
            if let key = task.idempotencyKey { admission.keys[key] = task }
            // `admitted` changes nothing else for a disabled session (and no refusal): the API's text
            // is this task's.
            let rendered = !session.enabled && refusal == nil ? part.waitingJSON?[offset] : nil
            results.append((task, true, rendered))
            if task.state.isFinal {
                try writeKept()
                try TaskRows.insert(db, CollectionOfOne(task), feed: feed)
                try recorded(db, from: nil, to: task, now: now, data: rendered)
            } else {
                kept.append(results.count - 1)
            }
        }
        try writeKept()
        return results
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

    /// Applies a client change to an unfinished task (PATCH) inside the write transaction; then
    /// the task is moved as the change calls for (`TaskInput.patched`). `change` may throw a
    /// ValidationError.
    public func updateTask(id: String, _ change: @escaping @Sendable (inout TaskRecord) throws -> Void) throws(StoreError)
        -> TaskRecord
    {
        let now = self.now
        return try write { [self] db in
            guard let current = try TaskRows.fetch(db, id: id) else { throw StoreError.notFound }
            let (next, releases) = try StoreRules.patched(current, change, now: now)
            // The old upload resource is released as on cancel, durably with the change.
            if releases { try scheduleCleanup(db, for: current, now: now) }
            try save(db, from: current, to: next, now: now)
            if next.state == .running { recorder.markPatched(next.sequence) }
            return next
        }
    }

    /// cancel / suspend / resume (OpenAPI/backhaul.yaml); a refused transition is a conflict.
    public func apply(
        _ command: TaskCommand, to id: String,
        reason: CancellationReason = .userCancelled
    ) throws(StoreError) -> TaskRecord {
        let now = self.now
        return try write { [self] db in try transition(db, id: id, .command(command, reason), now: now) }
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

    /// A task's attempts, newest first (at most `AttemptRecord.historyLimit`); nil when there is
    /// no such task.
    public func attempts(taskID: String) throws(StoreError) -> [AttemptRecord]? {
        try read { db in
            guard let sequence = try db.queryFirst("SELECT seq FROM tasks WHERE id = ?", [taskID], { $0.int(0) }) else {
                return nil
            }
            return try db.query(
                """
                SELECT number, started_at, ended_at, bytes_sent, bytes_received, outcome, http_status, error, network_type
                FROM attempts WHERE task_seq = ? ORDER BY number DESC
                """, [sequence]
            ) { row in try StoreRules.decodeAttempt(row, taskID: taskID) }
        }
    }

    /// Counts of waiting tasks by reason (metrics).
    public func waitingCounts() throws(StoreError) -> [WaitingReason: Int] {
        try read { db in
            var counts: [WaitingReason: Int] = [:]
            for (reason, count) in try db.query(
                "SELECT waiting_reason, COUNT(*) FROM tasks WHERE state = 'waiting' GROUP BY waiting_reason", [],
                { ($0.optionalString(0) ?? "", Int($0.int(1))) })
            {
                if let reason = WaitingReason(rawValue: reason) { counts[reason] = count }
            }
            return counts
        }
    }

    /// Counts of tasks by state, over all sessions and tasks whose session is gone (metrics, info).
    public func taskCounts() throws(StoreError) -> [TaskState: Int] {
        try read { db in
            // From the per-session counts, plus the tasks whose session was removed (an index range):
            // no walk over every task.
            var counts: [TaskState: Int] = [:]
            for (state, count) in try db.query(
                """
                SELECT state, SUM(count) FROM session_counts GROUP BY state
                UNION ALL SELECT state, COUNT(*) FROM tasks WHERE session_id = '' GROUP BY state
                """, [], { ($0.string(0), Int($0.int(1))) })
            {
                guard let state = TaskState(rawValue: state) else { throw StoreError.corrupt("tasks are in the state \(state)") }
                counts[state, default: 0] += count
            }
            return counts
        }
    }
}
