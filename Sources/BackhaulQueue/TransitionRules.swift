import BackhaulCore
import JSONCodec

/// Carrying out a task transition (`TaskRecord.applying`, in Core) inside the driver's open
/// transaction, once for both drivers: the changed columns, the event the new state calls for
/// (with its deliveries), the release of a cancelled task's server side, and the session's end.
extension StoreDriver {
    /// Applies `input` to the task `id` and writes the result. Throws `StoreError.notFound`, or
    /// `StoreError.conflict` when the input does not apply to the task as it is.
    @discardableResult
    package func transition(_ tx: Transaction, id: String, _ input: TaskInput, now: Timestamp) throws -> TaskRecord {
        guard let task = try lockedTask(tx, id: id) else { throw StoreError.notFound }
        return try transition(tx, task, input, now: now)
    }

    @discardableResult
    package func transition(_ tx: Transaction, _ task: TaskRecord, _ input: TaskInput, now: Timestamp) throws -> TaskRecord {
        try save(tx, from: task, to: try StoreRules.applying(input, to: task, now: now), now: now)
    }

    /// Writes `after` over `before` (the row as read in this transaction) and records what the
    /// change calls for; the task as written.
    @discardableResult
    package func save(_ tx: Transaction, from before: TaskRecord, to after: TaskRecord, now: Timestamp) throws -> TaskRecord {
        guard after != before else { return after }
        let written = try writeRow(tx, from: before, to: after)
        try recorded(tx, from: before, to: written, now: now)
        return written
    }

    /// Applies `input` to `task` (the row as read, or the engine's copy of it) and, when it applies,
    /// writes the result with `write`: a guarded update that answers nil when the row has moved on
    /// (the driver's guard: the attempt on SQLite; the revision and the lease on PostgreSQL). Then
    /// records what the change calls for. The task as written, or nil.
    package func move(
        _ tx: Transaction, _ task: TaskRecord, _ input: TaskInput, now: Timestamp,
        writing write: (TaskRecord) throws -> TaskRecord?
    ) throws -> TaskRecord? {
        guard case .success(let next) = task.applying(input, now: now), let written = try write(next) else { return nil }
        try recorded(tx, from: task, to: written, now: now)
        return written
    }

    /// What a new or changed task calls for besides its row (OpenAPI/backhaul.yaml). `data`, when
    /// given, is the task's JSON already rendered (its event's data).
    package func recorded(
        _ tx: Transaction, from before: TaskRecord?, to task: TaskRecord, now: Timestamp, data: String? = nil
    ) throws {
        if let type = TaskTransition.event(from: before, to: task) {
            try appendEvent(
                tx, type: type.rawValue, sessionID: task.sessionID, taskID: task.id, data: data ?? task.jsonText(), now: now)
        }
        if TaskTransition.releasesServerSide(from: before, to: task) { try scheduleCleanup(tx, for: task, now: now) }
        if TaskTransition.finished(from: before, to: task) {
            try sessionTaskReachedFinalState(tx, sessionID: task.sessionID, now: now)
        }
    }

    /// A cancelled task whose protocol may have left something at the server (a tus upload, an
    /// S3 multipart upload) gets what releases it, queued in the same transaction: a crash after
    /// the cancel still releases it after the restart.
    package func scheduleCleanup(_ tx: Transaction, for task: TaskRecord, now: Timestamp) throws {
        let defaults = try sessionRecord(tx, id: task.sessionID)?.configuration.defaultHeaders ?? []
        let machine = TransferMachines.machine(for: task, headers: HeaderRules.merged(defaults, task.request.headers))
        guard let plan = machine.cancellation else { return }
        try insertCleanup(tx, taskID: task.id, plan, now: now)
    }

    /// After a task of the session finished: `session.drained` when nothing is left to do, and a
    /// finishing session's record goes.
    package func sessionTaskReachedFinalState(_ tx: Transaction, sessionID: String, now: Timestamp) throws {
        guard !sessionID.isEmpty, let finishing = try drainedSessionIsFinishing(tx, sessionID: sessionID) else { return }
        var summary = JSONObject()
        for (state, count) in try counts(tx, sessionID: sessionID) { summary[state.rawValue] = .int(Int64(count)) }
        try appendEvent(
            tx, type: "session.drained", sessionID: sessionID, taskID: nil,
            data: JSON.object(["session_id": .string(sessionID), "task_counts": .object(summary)]).serialized(), now: now)
        if finishing { try removeSession(tx, id: sessionID) }
    }
}
