import BackhaulCore

/// What the store's rules need of a database, and nothing that decides (River's
/// `riverdriver.Executor`): reads and writes of rows inside one of its transactions, each in the
/// driver's own SQL, with its own locking (`FOR UPDATE` on PostgreSQL; the single writer on
/// SQLite). The rules written once over it are in `TransitionRules`, `TaskAdmission` and
/// `AttemptRules`; `Store` (SQLite) and `PostgresStore` carry them out.
public protocol StoreDriver: AnyObject {
    /// The driver's open transaction (a connection inside `BEGIN`, and what it records).
    associatedtype Transaction

    var now: Timestamp { get }

    /// Runs `body` in the next write transaction and returns once it committed durably.
    func write<T>(_ body: @escaping (Transaction) throws -> T) throws(StoreError) -> T

    /// Runs `body` on a read connection: it sees the last commit and waits for no writer.
    func read<T>(_ body: (Transaction) throws -> T) throws(StoreError) -> T

    /// Hands `body` to the writer without waiting; `done` runs after the commit, in commit order.
    func submit<T>(_ body: @escaping (Transaction) throws -> T, done: @escaping (Result<T, StoreError>) -> Void)

    // MARK: Task rows

    /// The task, held for this transaction's change where the database holds rows.
    func lockedTask(_ tx: Transaction, id: String) throws -> TaskRecord?
    func lockedTask(_ tx: Transaction, sequence: Int64) throws -> TaskRecord?
    /// The task as this transaction sees it, not held (a progress report, which must not wait).
    func currentTask(_ tx: Transaction, sequence: Int64) throws -> TaskRecord?
    /// Every unfinished task, in creation order, held.
    func lockedUnfinishedTasks(_ tx: Transaction) throws -> [TaskRecord]
    /// Writes `after` over `before` (the row as read in `tx`): the changed columns only. The task as
    /// written (its revision counted where the driver keeps one).
    func writeRow(_ tx: Transaction, from before: TaskRecord, to after: TaskRecord) throws -> TaskRecord
    /// A running attempt's bytes (and checkpoint, when given), if the task is still in `attempt`.
    func writeProgress(_ tx: Transaction, sequence: Int64, attempt: Int, bytesTransferred: Int64, checkpoint: String?)
        throws
    /// Appends an attempt to a task's history and drops what falls beyond `AttemptRecord.historyLimit`.
    func appendAttempt(_ tx: Transaction, taskSequence: Int64, _ record: AttemptRecord) throws
    /// The sequence of the task `id`, if there is one.
    func taskSequence(_ tx: Transaction, id: String) throws -> Int64?
    /// The task's attempts, newest first.
    func attemptRecords(_ tx: Transaction, taskSequence: Int64, taskID: String) throws -> [AttemptRecord]
    /// A client changed the running task `task` (its end must read the row again).
    func notePatchedWhileRunning(_ tx: Transaction, _ task: TaskRecord)

    // MARK: What a change calls for

    /// An event and, in the same transaction, its deliveries (the outbox).
    func appendEvent(_ tx: Transaction, type: String, sessionID: String, taskID: String?, data: String, now: Timestamp)
        throws
    /// A session's events in order, as `appendEvent` each.
    func appendEvents(_ tx: Transaction, sessionID: String, _ events: [NewEvent], now: Timestamp) throws
    /// Queues what releases a task's server side.
    func insertCleanup(_ tx: Transaction, taskID: String, _ plan: CleanupPlan, now: Timestamp) throws
    func sessionRecord(_ tx: Transaction, id: String) throws -> SessionRecord?
    /// After a task of the session finished: nil while the session has unfinished tasks (or, where
    /// the driver needs the session's row to count, none), else whether the session is finishing.
    func drainedSessionIsFinishing(_ tx: Transaction, sessionID: String) throws -> Bool?
    /// The session's tasks by state, as this transaction sees them.
    func counts(_ tx: Transaction, sessionID: String) throws -> [TaskState: Int]
    /// Removes the session's record; its tasks (all final) stay readable by id, detached.
    func removeSession(_ tx: Transaction, id: String) throws

    // MARK: Admission (`TaskAdmission`)

    /// The session new tasks go to, held for the batch where the database holds rows, and its
    /// unfinished tasks (counted only when `countOpen`, else 0).
    func admissionSession(_ tx: Transaction, id: String, countOpen: Bool) throws -> (session: SessionRecord, open: Int)?
    /// The bytes of the session's unfinished tasks.
    func heldBytes(_ tx: Transaction, sessionID: String) throws -> Int64
    /// The task of the session that the idempotency key names, if any.
    func taskByKey(_ tx: Transaction, sessionID: String, idempotencyKey: String) throws -> TaskRecord?
    /// The next new task's sequence; `remaining` tasks of the part are still to be numbered.
    func nextSequence(_ tx: Transaction, _ admission: inout TaskAdmission, remaining: Int) throws -> Int64
    /// The node a new task is pinned to, if the driver pins tasks.
    func pin(for task: TaskRecord) -> String?
    /// Inserts the tasks at `positions` of `results`, many rows a statement.
    func insertTasks(_ tx: Transaction, _ results: [TaskBatch.Inserted], at positions: [Int]) throws
    /// The new tasks at `positions` of `results` were inserted: those queued go to the scheduler.
    func noteCreated(_ tx: Transaction, _ results: [TaskBatch.Inserted], at positions: [Int])
}

/// A session's event about one of its tasks, not yet written.
public struct NewEvent {
    public var type: String
    public var taskID: String?
    public var data: String

    public init(type: String, taskID: String?, data: String) {
        self.type = type
        self.taskID = taskID
        self.data = data
    }
}
