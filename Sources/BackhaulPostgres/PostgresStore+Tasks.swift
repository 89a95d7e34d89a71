import BackhaulCore
import BackhaulQueue
import JSONCodec
import PostgreSQL

/// The tasks as clients see and change them (OpenAPI/backhaul.yaml), as `Store+Tasks` keeps them
/// for SQLite; admission is the rules' (`TaskAdmission`), this driver's pins included.
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
                var admission = try openAdmission(tx, sessionID: sessionID, adding: batch.count, maxOpen: maxOpen)
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

    public func deleteTask(id: String) throws(StoreError) {
        let (_, events) = try write { tx in
            guard let task = try PostgresTaskRows.fetch(tx, id: id) else { throw StoreError.notFound }
            guard task.state.isFinal else { throw StoreError.conflict("only finished tasks can be deleted; cancel it first") }
            return try PostgresTaskRows.deleteFinished(tx, sequences: [task.sequence])
        }
        figures.withLock { $0.eventsPruned += events }
    }

    public func waitingCounts() throws(StoreError) -> [WaitingReason: Int] {
        try read { tx in
            try StoreRules.counts(
                tx.rows(
                    "SELECT waiting_reason, count(*) FROM tasks WHERE state = 'waiting' GROUP BY waiting_reason", [],
                    { ($0.optionalString(0) ?? "", Int($0.int(1))) }))
        }
    }

    public func taskCounts() throws(StoreError) -> [TaskState: Int] {
        try read { tx in
            try StoreRules.counts(
                try tx.rows("SELECT state, count(*) FROM tasks GROUP BY state", [], { ($0.string(0), Int($0.int(1))) }),
                unknown: StoreRules.unknownState)
        }
    }
}
