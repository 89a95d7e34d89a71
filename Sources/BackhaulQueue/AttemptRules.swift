import BackhaulCore

/// The engine's and the clients' writes that decide the same on both databases, written once over
/// the driver. What differs stays in the drivers: how a start claims its task and how an end is
/// guarded (the single writer on SQLite; `SKIP LOCKED`, revisions and leases on PostgreSQL).
extension StoreDriver {
    /// Records an attempt the engine stopped after its task left it (a client's cancel or
    /// suspend, a session disabled, the resource timeout): the task's state is not touched.
    public func recordStoppedAttempt(sequence: Int64, _ history: AttemptRecord) {
        submit(
            { [self] tx in
                var stopped = history
                stopped.outcome = .stopped
                try appendAttempt(tx, taskSequence: sequence, stopped)
            }, done: { _ in })
    }

    /// Persists what the server acknowledged of a resumable transfer, if the task is still in
    /// that attempt.
    public func saveCheckpoint(sequence: Int64, attempt: Int, _ checkpoint: TransferCheckpoint) {
        let text = checkpoint.json.serialized()
        submit(
            { [self] tx in
                try writeProgress(
                    tx, sequence: sequence, attempt: attempt, bytesTransferred: checkpoint.offset, checkpoint: text)
            }, done: { _ in })
    }

    /// Persists a running attempt's progress and records a `task.progress` event (the engine
    /// calls this at a bounded rate).
    public func recordProgress(sequence: Int64, attempt: Int, bytesTransferred: Int64, live: LiveProgress) {
        let now = self.now
        submit(
            { [self] tx in
                guard var task = try currentTask(tx, sequence: sequence), task.state == .running, task.attempts == attempt
                else { return }
                task.bytesTransferred = bytesTransferred
                try writeProgress(tx, sequence: sequence, attempt: attempt, bytesTransferred: bytesTransferred, checkpoint: nil)
                try appendEvent(
                    tx, type: EventType.taskProgress.rawValue, sessionID: task.sessionID, taskID: task.id,
                    data: task.jsonText(live: live), now: now)
            }, done: { _ in })
    }

    /// A task's attempts, newest first (at most `AttemptRecord.historyLimit`); nil when there is
    /// no such task.
    public func attempts(taskID: String) throws(StoreError) -> [AttemptRecord]? {
        try read { tx in
            try taskSequence(tx, id: taskID).map { try attemptRecords(tx, taskSequence: $0, taskID: taskID) }
        }
    }

    /// Applies the policy's decision to a task that is queued or held by the policy: run puts it
    /// (back) in the queue, wait holds it with the reason (a `task.waiting` event when the reason
    /// changes), fail ends it. Nil when the task is in neither place any more.
    public func applyPolicy(
        sequence: Int64, _ decision: PolicyDecision,
        done: @escaping @Sendable (Result<TaskRecord?, StoreError>) -> Void = { _ in }
    ) {
        let now = self.now
        submit(
            { [self] tx -> TaskRecord? in
                guard let task = try lockedTask(tx, sequence: sequence),
                    case .success(let next) = task.applying(.policy(decision), now: now)
                else { return nil }
                return try save(tx, from: task, to: next, now: now)
            }, done: done)
    }

    /// The service-wide switch: every unfinished task is cancelled with `reason`. Returns how many.
    public func cancelUnfinished(reason: CancellationReason) throws(StoreError) -> Int {
        let now = self.now
        return try write { [self] tx in
            let tasks = try lockedUnfinishedTasks(tx)
            for task in tasks { try transition(tx, task, .serviceCancelled(reason, nil), now: now) }
            return tasks.count
        }
    }

    /// A task whose file could not be removed says so (`FileToRemove.notRemoved`).
    public func recordFileNotRemoved(taskID: String, _ error: TaskError) {
        let now = self.now
        submit(
            { [self] tx in
                guard let current = try lockedTask(tx, id: taskID) else { return }
                try save(tx, from: current, to: FileToRemove.notRemoved(current, error, at: now), now: now)
            }, done: { _ in })
    }

    /// cancel / suspend / resume (OpenAPI/backhaul.yaml); a refused transition is a conflict.
    public func apply(
        _ command: TaskCommand, to id: String, reason: CancellationReason = .userCancelled
    ) throws(StoreError) -> TaskRecord {
        let now = self.now
        return try write { [self] tx in try transition(tx, id: id, .command(command, reason), now: now) }
    }

    /// Applies a client change to an unfinished task (PATCH) inside the write transaction; then
    /// the task is moved as the change calls for (`TaskInput.patched`). `change` may throw a
    /// ValidationError.
    public func updateTask(id: String, _ change: @escaping @Sendable (inout TaskRecord) throws -> Void) throws(StoreError)
        -> TaskRecord
    {
        let now = self.now
        return try write { [self] tx in
            guard let current = try lockedTask(tx, id: id) else { throw StoreError.notFound }
            let (next, releases) = try StoreRules.patched(current, change, now: now)
            // The old upload resource is released as on cancel, durably with the change.
            if releases { try scheduleCleanup(tx, for: current, now: now) }
            let written = try save(tx, from: current, to: next, now: now)
            if written.state == .running { notePatchedWhileRunning(tx, written) }
            return written
        }
    }
}

extension StoreRules {
    /// A queued task as the scheduler needs it, from the columns seq, priority, session_id,
    /// host_key and the task's own `max_connections_per_host` (NULL when it has none).
    package static func queueEntry(_ row: some StoredRow) -> Scheduler.Entry {
        Scheduler.Entry(
            sequence: row.int(0), priority: row.double(1),
            key: Scheduler.Key(session: row.string(2), host: row.string(3)), limit: row.optionalInt(4).map { Int($0) })
    }

    /// A task the policy holds, from the columns seq, id, session_id, configuration, waiting_reason.
    package static func heldTask(_ row: some StoredRow) throws -> HeldTask {
        guard let reason = WaitingReason(rawValue: row.string(4)) else {
            throw StoreError.corrupt("task \(row.string(1)) waits for the reason \(row.string(4))")
        }
        return HeldTask(
            sequence: row.int(0), id: row.string(1), sessionID: row.string(2),
            configurationOverrides: try TaskRows.overrides(row.string(3), task: row.string(1)), reason: reason)
    }
}
