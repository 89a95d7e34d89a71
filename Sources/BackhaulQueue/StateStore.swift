import BackhaulCore
import JSONCodec

/// The durable state as the engine, the API, the webhook dispatcher and the housekeeper use it
/// (docs/architecture.md, "The store"). Two implementations: `Store`, one SQLite database in the
/// state directory (the default), and `PostgresStore`, one PostgreSQL database that several nodes
/// share (docs/fleet.md). The store's test suite runs against both.
///
/// Every method keeps the contract written on `Store`'s: a client's write is durable when it
/// returns; the engine's writes are handed over and `done` runs after the commit, in commit order;
/// every task change is reported to the observers (`StoreChanges`) after its commit.
public protocol StateStore: AnyObject, Sendable {
    // MARK: The store itself

    /// Calls `observer` after each commit that changed something, in commit order (see `Store.observe`).
    func observe(_ observer: @escaping @Sendable (StoreChanges) -> Void)
    /// Stops taking writes after those handed over; closing again does nothing.
    func close()
    /// The node is stopping: past `seconds` from now (its shutdown grace) and a moment more, a
    /// database that does not answer is no longer waited for (a call already sent to one still
    /// waits out its own bound, a lease); what is not written by then fails `unavailable`, and the
    /// leases and the next start make it good (docs/fleet.md). A local file needs nothing.
    func beginStop(within seconds: Double)
    /// Who removes the files committed batches let go (`FileToRemove`); until it is set, none is.
    func removeFiles(with remover: any FileRemover)
    /// Shows on a task, as its `last_error`, that its file was not removed (`-3004
    /// cannot_remove_file`); the task keeps its state. Handed over without waiting (the remover
    /// calls it on the writer's thread).
    func recordFileNotRemoved(taskID: String, _ error: TaskError)
    /// Checks the state answers and can be written (for `/readyz`).
    func isWritable() -> Bool
    /// The failure the store failed closed on, or nil while it takes writes.
    var failure: SyncFailure? { get }
    /// The salvage of a damaged state this start made or found, if any (SQLite only).
    var salvage: SalvageReport? { get }
    /// Damage found in the state while it is open, if any (SQLite only: `StateDamage`).
    var damage: StateDamage? { get }
    /// The housekeeping's figures (commits, checkpoints, pruning).
    var maintenanceFigures: MaintenanceFigures { get }
    /// A consistent copy of the state in `path` (`POST /v1/admin/backup`).
    func backup(to path: String) throws(StoreError) -> BackupResult
    /// The calling thread's writes wait until `releaseWrites`, then go together (the engine's turn).
    func holdWrites()
    /// Whether any writes were held (and went).
    @discardableResult func releaseWrites() -> Bool
    /// Whether the calling thread holds writes it has not released yet.
    var holdsWrites: Bool { get }
    /// The nodes of the fleet sharing the state; nil for a store of one daemon (SQLite).
    func nodes() throws(StoreError) -> [NodeRecord]?
    /// The fence on the bytes this node sends while it holds leases (`LeaseFence`); nil for a store of
    /// one daemon (SQLite).
    var leaseFence: LeaseFence? { get }

    // MARK: Sessions

    func putSession(id: String, configuration: TransferConfiguration) throws(StoreError) -> (SessionRecord, Bool)
    func sessionRecord(id: String) throws(StoreError) -> SessionRecord?
    func session(id: String) throws(StoreError) -> (SessionRecord, [TaskState: Int])?
    func sessions() throws(StoreError) -> [(SessionRecord, [TaskState: Int])]
    func sessionConfigurations() throws(StoreError) -> [String: TransferConfiguration]
    func updateSession(
        id: String, cancelPending: Bool,
        _ change: @escaping @Sendable (SessionRecord) throws -> (configuration: TransferConfiguration?, enabled: Bool?)
    ) throws(StoreError) -> (SessionRecord, [TaskState: Int])
    func deleteSession(id: String, cancel: Bool) throws(StoreError) -> Bool

    // MARK: Tasks, as clients see and change them

    func createTasks(sessionID: String, _ tasks: [TaskRecord], maxOpen: Int) throws(StoreError) -> [(TaskRecord, Bool)]
    func createTasks(sessionID: String, _ batch: TaskBatch, maxOpen: Int) -> PendingWrite<[(TaskRecord, Bool)]>
    func task(id: String) throws(StoreError) -> TaskRecord?
    func tasks(sessionID: String, state: TaskState?, cursor: String?, limit: Int) throws(StoreError) -> TaskPage
    func updateTask(id: String, _ change: @escaping @Sendable (inout TaskRecord) throws -> Void) throws(StoreError)
        -> TaskRecord
    func apply(_ command: TaskCommand, to id: String, reason: CancellationReason) throws(StoreError) -> TaskRecord
    func deleteTask(id: String) throws(StoreError)
    func attempts(taskID: String) throws(StoreError) -> [AttemptRecord]?
    func waitingCounts() throws(StoreError) -> [WaitingReason: Int]
    func taskCounts() throws(StoreError) -> [TaskState: Int]
    func cancelUnfinished(reason: CancellationReason) throws(StoreError) -> Int

    // MARK: The engine's side

    func recoverInterrupted() throws(StoreError) -> (requeued: Int, failed: [String])
    func queuedEntries(after sequence: Int64, limit: Int) throws(StoreError) -> [Scheduler.Entry]
    func task(sequence: Int64) throws(StoreError) -> TaskRecord?
    func startAttempt(_ task: TaskRecord, done: @escaping @Sendable (Result<TaskRecord?, StoreError>) -> Void)
    func finishAttempt(
        _ task: TaskRecord, bytesTransferred: Int64, end: AttemptEnd, history: AttemptRecord,
        done: @escaping @Sendable (Result<TaskRecord?, StoreError>) -> Void)
    func recordStoppedAttempt(sequence: Int64, _ history: AttemptRecord)
    func requeueRunning(except running: Set<String>, done: @escaping @Sendable (Result<Int, StoreError>) -> Void)
    func saveCheckpoint(sequence: Int64, attempt: Int, _ checkpoint: TransferCheckpoint)
    func recordProgress(sequence: Int64, attempt: Int, bytesTransferred: Int64, live: LiveProgress)
    func fireTimers(now: Timestamp, done: @escaping @Sendable (Result<(expired: Int, next: Timestamp?), StoreError>) -> Void)
    func nextTimer() throws(StoreError) -> Timestamp?
    func policyHeldTasks(afterSequence: Int64, limit: Int) throws(StoreError) -> [HeldTask]
    func applyPolicy(
        sequence: Int64, _ decision: PolicyDecision, done: @escaping @Sendable (Result<TaskRecord?, StoreError>) -> Void)

    // MARK: Cleanups (server-side releases of cancelled tasks)

    func dueCleanups(now: Timestamp, limit: Int, excluding busy: Set<Int64>) throws(StoreError) -> [DueCleanup]
    func replaceCleanup(sequence: Int64, with found: [(uploadID: String, plan: CleanupPlan)]) throws(StoreError) -> Int
    func recordCleanup(sequence: Int64, retryAt: Timestamp?) throws(StoreError)

    // MARK: Events and webhooks

    func lastEventSequence() throws(StoreError) -> Int64
    func events(after sequence: Int64, session: String?, limit: Int, sessions allowed: (@Sendable (String) -> Bool)?)
        throws(StoreError) -> [EventRecord]
    func createWebhook(_ webhook: WebhookRecord) throws(StoreError)
    func webhook(id: String) throws(StoreError) -> WebhookRecord?
    func webhooks(sessionID: String) throws(StoreError) -> [WebhookRecord]
    func updateWebhook(id: String, _ change: @escaping @Sendable (inout WebhookRecord) throws -> Void) throws
        -> WebhookRecord
    func deleteWebhook(id: String) throws(StoreError)
    func deliveries(webhookID: String, state: DeliveryRecord.State?, cursor: String?, limit: Int) throws(StoreError)
        -> (deliveries: [DeliveryRecord], nextCursor: String?)
    func dueDeliveries(now: Timestamp, limit: Int, excluding inFlight: Set<Int64>) throws(StoreError) -> [PendingDelivery]
    func nextDeliveryAt(excluding inFlight: Set<Int64>) throws(StoreError) -> Timestamp?
    func recordDeliveryAttempt(
        sequence: Int64, status: Int?, error: String?, decision: DeliveryPlan.Decision,
        done: @escaping @Sendable (StoreError?) -> Void)
    func deliveryCounts() throws(StoreError) -> [DeliveryRecord.State: Int]

    // MARK: Settings and budgets

    func setting(_ key: String) throws(StoreError) -> JSON?
    func setSetting(_ key: String, _ value: JSON?, staging: @escaping () -> Void) throws(StoreError)
    func addBudgetUsage(day: String, _ bytes: [NetworkType: Int64])
    func budgetUsage(day: String) throws(StoreError) -> [NetworkType: Int64]

    // MARK: Retention

    func pruneFinishedTasks(defaultRetention: Double, batch: Int) throws(StoreError) -> Int
    func shortestRetention(defaultRetention: Double) throws(StoreError) -> Double
    func pruneEventLog(olderThan retention: Double, batch: Int) throws(StoreError) -> Int
    func vacuumFreePages(_ pages: Int) throws(StoreError) -> Int
    func oldestFinishedTask(now: Timestamp) throws(StoreError) -> Double?
}

/// The defaults of the requirements' arguments.
extension StateStore {
    public func createTasks(sessionID: String, _ tasks: [TaskRecord]) throws(StoreError) -> [(TaskRecord, Bool)] {
        try createTasks(sessionID: sessionID, tasks, maxOpen: .max)
    }

    public func createTasks(sessionID: String, _ batch: TaskBatch) -> PendingWrite<[(TaskRecord, Bool)]> {
        createTasks(sessionID: sessionID, batch, maxOpen: .max)
    }

    public func apply(_ command: TaskCommand, to id: String) throws(StoreError) -> TaskRecord {
        try apply(command, to: id, reason: .userCancelled)
    }

    public func applyPolicy(sequence: Int64, _ decision: PolicyDecision) {
        applyPolicy(sequence: sequence, decision, done: { _ in })
    }

    public func events(after sequence: Int64, session: String? = nil, limit: Int = 500) throws(StoreError) -> [EventRecord] {
        try events(after: sequence, session: session, limit: limit, sessions: nil)
    }

    public func nextDeliveryAt() throws(StoreError) -> Timestamp? { try nextDeliveryAt(excluding: []) }

    public func setSetting(_ key: String, _ value: JSON?) throws(StoreError) { try setSetting(key, value, staging: {}) }

    public func pruneFinishedTasks(defaultRetention: Double) throws(StoreError) -> Int {
        try pruneFinishedTasks(defaultRetention: defaultRetention, batch: 500)
    }

    public func pruneEventLog(olderThan retention: Double) throws(StoreError) -> Int {
        try pruneEventLog(olderThan: retention, batch: 2000)
    }

    public func vacuumFreePages() throws(StoreError) -> Int { try vacuumFreePages(2000) }
}

/// A node in the fleet, as `GET /v1/nodes` shows it.
public struct NodeRecord: Sendable, Equatable {
    public var id: String
    public var version: String
    public var startedAt: Timestamp
    /// When its last heartbeat reached the database (the database's clock).
    public var lastHeartbeatAt: Timestamp
    /// Seconds since then, by the database's clock.
    public var silentSeconds: Double
    public var running: Int
    /// The node's own network, as its `GET /v1/network` shows it (JSON text), if it said.
    public var network: String?

    package init(
        id: String, version: String, startedAt: Timestamp, lastHeartbeatAt: Timestamp, silentSeconds: Double, running: Int,
        network: String?
    ) {
        self.id = id
        self.version = version
        self.startedAt = startedAt
        self.lastHeartbeatAt = lastHeartbeatAt
        self.silentSeconds = silentSeconds
        self.running = running
        self.network = network
    }
}
