import BackhaulCore
import BackhaulStore
import JSONCodec
import PostgreSQL

/// The tasks as clients see and change them (OpenAPI/backhaul.yaml), as `Store+Tasks` keeps them
/// for SQLite. A new task is pinned to this node unless its file is under a shared root.
extension PostgresStore {
    public func createTasks(sessionID: String, _ tasks: [TaskRecord], maxOpen: Int) throws(StoreError) -> [(TaskRecord, Bool)] {
        try createTasks(sessionID: sessionID, TaskBatch(tasks), maxOpen: maxOpen).wait()
    }

    /// The session's row is locked for the batch, so that the open-task limit and the quota hold
    /// across the fleet: two nodes adding to one session take turns.
    public func createTasks(sessionID: String, _ batch: TaskBatch, maxOpen: Int) -> PendingWrite<[(TaskRecord, Bool)]> {
        let now = self.now
        let pending = PendingWrite<[(TaskRecord, Bool)]>()
        submit(
            durable: true,
            { [self] tx -> [(TaskRecord, Bool)] in
                batch.beginRun()
                guard let (session, open) = try lockedSession(tx, id: sessionID) else { throw StoreError.notFound }
                guard session.lifecycle == .active else {
                    throw StoreError.conflict("the session is finishing and accepts no new tasks")
                }
                if open + batch.count > maxOpen { throw StoreError.tooManyTasks(open: open, limit: maxOpen) }
                var admission = Admission(session: session)
                if session.configuration.quotaBytes != nil {
                    admission.held =
                        try tx.first(
                            "SELECT COALESCE(sum(file_size), 0) FROM tasks WHERE session_id = $1 AND finished_at IS NULL",
                            [.text(sessionID)]
                        ) { $0.int(0) } ?? 0
                }
                let mark = tx.mark
                return try batch.insertParts(
                    run: { try tx.execute($0) }, undo: { tx.rollBack(to: mark) },
                    admit: { part in try admit(part, &admission, tx, now: now) })
            },
            done: { result in
                switch result {
                case .success(let value):
                    pending.value = value
                    pending.finish(nil)
                case .failure(let error):
                    pending.finish(error)
                }
                batch.end()
            })
        return pending
    }

    /// `count` new task sequences, from a block this node took from the table's sequence (one round
    /// trip every 200 tasks, not one per request). Sequences are unique and rise on each node; a
    /// block given back by a rolled-back transaction is a gap, as a rolled-back `nextval` is.
    func taskSequences(_ tx: PostgresTransaction, _ count: Int) throws -> [Int64] {
        let taken = sequenceBlock.withLock { block -> [Int64] in
            guard block.count >= count else { return [] }
            defer { block.removeFirst(count) }
            return Array(block.prefix(count))
        }
        if !taken.isEmpty || count == 0 { return taken }
        let fetched = try tx.rows(
            "SELECT nextval(pg_get_serial_sequence('tasks', 'seq')) FROM generate_series(1, $1)", [.int(count + 200)]
        ) { $0.int(0) }
        sequenceBlock.withLock { $0 = Array(fetched.dropFirst(count)) }
        return Array(fetched.prefix(count))
    }

    /// What admitting a batch carries from one task to the next (see `Store.Admission`).
    struct Admission {
        let session: SessionRecord
        var keys: [String: TaskRecord] = [:]
        var held: Int64 = 0
    }

    /// Admits a part of a batch, task by task in order, as `Store.admit` does.
    private func admit(_ part: TaskBatch.Part, _ admission: inout Admission, _ tx: PostgresTransaction, now: Timestamp) throws
        -> [TaskBatch.Inserted]
    {
        let session = admission.session
        let sequences = try taskSequences(tx, part.tasks.count)
        var results: [TaskBatch.Inserted] = []
        var kept: [Int] = []
        func writeKept() throws {
            guard !kept.isEmpty else { return }
            let tasks = kept.map { results[$0].task }
            PostgresTaskRows.insert(tx, tasks)
            for position in kept {
                let (task, _, rendered) = results[position]
                if let type = TaskTransition.event(from: nil, to: task) {
                    appendEvent(
                        tx, type: type.rawValue, sessionID: session.id, taskID: task.id, data: rendered ?? task.jsonText(),
                        now: now)
                }
            }
            tx.changes.created += tasks.filter { $0.state == .queued }
            kept.removeAll()
        }
        for (offset, draft) in part.tasks.enumerated() {
            if let key = draft.idempotencyKey {
                if let existing = admission.keys[key] {
                    results.append((existing, false, nil))
                    continue
                }
                if let existing = try tx.first(
                    "\(PostgresTaskRows.select) WHERE session_id = $1 AND idempotency_key = $2 AND detached_from IS NULL",
                    [.text(session.id), .text(key)], PostgresTaskRows.decode)
                {
                    results.append((existing, false, nil))
                    continue
                }
            }
            var refusal: String?
            if let quota = session.configuration.quotaBytes, admission.held + draft.file.size > quota {
                refusal = "cancelled: the session's quota_bytes (\(quota)) cannot hold \(draft.file.size) more bytes"
            }
            var task = draft.admitted(sessionEnabled: session.enabled, quotaRefusal: refusal, now: now)
            task.sequence = sequences[offset]
            task.node = PostgresTaskRows.pin(for: task, node: node, sharedRoots: options.sharedRoots)
            if !task.state.isFinal { admission.held += task.file.size }
            if let key = task.idempotencyKey { admission.keys[key] = task }
            // The API's rendering knows no pin: a pinned task is rendered here, with its `node`.
            let rendered = !session.enabled && refusal == nil && task.node == nil ? part.waitingJSON?[offset] : nil
            results.append((task, true, rendered))
            if task.state.isFinal {
                try writeKept()
                PostgresTaskRows.insert(tx, [task])
                try recorded(tx, from: nil, to: task, now: now, data: rendered)
            } else {
                kept.append(results.count - 1)
            }
        }
        try writeKept()
        return results
    }

    public func task(id: String) throws(StoreError) -> TaskRecord? {
        try read { tx in try PostgresTaskRows.fetch(tx, id: id, lock: false) }
    }

    public func tasks(sessionID: String, state: TaskState?, cursor: String?, limit: Int) throws(StoreError) -> TaskPage {
        let after = cursor.flatMap { Int64($0) } ?? 0
        return try read { tx in
            let rows: [TaskRecord]
            if let state {
                rows = try tx.rows(
                    "\(PostgresTaskRows.select) WHERE session_id = $1 AND state = $2 AND seq > $3 ORDER BY seq LIMIT $4",
                    [.text(sessionID), .text(state.rawValue), .int(after), .int(limit + 1)], PostgresTaskRows.decode)
            } else {
                rows = try tx.rows(
                    "\(PostgresTaskRows.select) WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                    [.text(sessionID), .int(after), .int(limit + 1)], PostgresTaskRows.decode)
            }
            return TaskPage(reading: rows, limit: limit)
        }
    }

    /// A client's change (PATCH). It counts the row's revision, so the node running the task finds
    /// the row changed at the attempt's end and reads it again; that update is guarded by the
    /// attempt and writes only the columns the attempt changed.
    public func updateTask(id: String, _ change: @escaping @Sendable (inout TaskRecord) throws -> Void) throws(StoreError)
        -> TaskRecord
    {
        let now = self.now
        return try write { [self] tx in
            guard let current = try PostgresTaskRows.fetch(tx, id: id) else { throw StoreError.notFound }
            let (next, releases) = try StoreRules.patched(current, change, now: now)
            if releases { try scheduleCleanup(tx, for: current, now: now) }
            return try save(tx, from: current, to: next, now: now)
        }
    }

    public func apply(_ command: TaskCommand, to id: String, reason: CancellationReason) throws(StoreError) -> TaskRecord {
        let now = self.now
        return try write { [self] tx in try transition(tx, id: id, .command(command, reason), now: now) }
    }

    public func deleteTask(id: String) throws(StoreError) {
        let (_, events) = try write { tx in
            guard let task = try PostgresTaskRows.fetch(tx, id: id) else { throw StoreError.notFound }
            guard task.state.isFinal else { throw StoreError.conflict("only finished tasks can be deleted; cancel it first") }
            return try PostgresTaskRows.deleteFinished(tx, sequences: [task.sequence])
        }
        figures.withLock { $0.eventsPruned += events }
    }

    public func attempts(taskID: String) throws(StoreError) -> [AttemptRecord]? {
        try read { tx in
            guard let sequence = try tx.first("SELECT seq FROM tasks WHERE id = $1", [.text(taskID)], { $0.int(0) }) else {
                return nil
            }
            return try tx.rows(
                """
                SELECT number, started_at, ended_at, bytes_sent, bytes_received, outcome, http_status, error, network_type
                FROM attempts WHERE task_seq = $1 ORDER BY number DESC
                """, [.int(sequence)]
            ) { row in try StoreRules.decodeAttempt(row, taskID: taskID) }
        }
    }

    public func waitingCounts() throws(StoreError) -> [WaitingReason: Int] {
        try read { tx in
            var counts: [WaitingReason: Int] = [:]
            for (reason, count) in try tx.rows(
                "SELECT waiting_reason, count(*) FROM tasks WHERE state = 'waiting' GROUP BY waiting_reason", [],
                { ($0.optionalString(0) ?? "", Int($0.int(1))) })
            {
                if let reason = WaitingReason(rawValue: reason) { counts[reason] = count }
            }
            return counts
        }
    }

    public func taskCounts() throws(StoreError) -> [TaskState: Int] {
        try read { tx in
            var counts: [TaskState: Int] = [:]
            for (state, count) in try tx.rows(
                "SELECT state, count(*) FROM tasks GROUP BY state", [], { ($0.string(0), Int($0.int(1))) })
            {
                guard let state = TaskState(rawValue: state) else { throw StoreError.corrupt("tasks are in the state \(state)") }
                counts[state, default: 0] += count
            }
            return counts
        }
    }

    public func cancelUnfinished(reason: CancellationReason) throws(StoreError) -> Int {
        let now = self.now
        return try write { [self] tx in
            let tasks = try tx.rows(
                "\(PostgresTaskRows.select) WHERE finished_at IS NULL ORDER BY seq FOR UPDATE", [], PostgresTaskRows.decode)
            for task in tasks { try transition(tx, task, .serviceCancelled(reason, nil), now: now) }
            return tasks.count
        }
    }
}
