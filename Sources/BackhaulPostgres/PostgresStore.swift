import BackhaulCore
import BackhaulQueue
import JSONCodec
import PostgreSQL
import Threads

/// The state in one PostgreSQL database that several daemons share (docs/fleet.md): the second
/// implementation of `StateStore`, beside SQLite's `Store`.
///
/// - **Writes** go through one writer per node (`PostgresWriter`): a thread with its own connection
///   that joins the jobs waiting into one transaction, as the SQLite writer does (a savepoint each
///   only when one threw and the transaction runs again). Rows a write reads to change are locked
///   (`FOR UPDATE`), or written only while at the revision read (`TaskRecord.revision`), so two
///   nodes changing one task take turns; a deadlock or serialization failure runs the transaction
///   again.
/// - **Events** are appended at the end of each transaction under a transaction-scoped advisory
///   lock, so their sequence is their commit order on every node and a reader resuming after
///   `Last-Event-ID` never skips one committed late.
/// - **Changes** reach this node's observers after each commit, and the other nodes' through
///   `NOTIFY` (`PostgresChangeFeed`).
/// - **Leases**: a task started here is leased to this node; the heartbeat (`PostgresStore+Leases`)
///   renews them and takes over the tasks of nodes that stopped.
/// - **Reads** use a small pool of connections of their own.
public final class PostgresStore: @unchecked Sendable {
    // @unchecked: every mutable part is behind a lock or owned by one thread.

    /// How the store joins the fleet.
    public struct Options: Sendable {
        /// The libpq connection URL (`postgres://user:password@host:port/database?…`).
        public var url: String
        /// This node's id (docs/fleet.md; the daemon's default is the host name).
        public var node: String
        /// How long a task stays leased to this node without a heartbeat.
        public var leaseSeconds: Double = 30
        /// Directories every node sees: tasks whose file is under one run on any node; others are
        /// pinned to the node that accepted them.
        public var sharedRoots: [String] = []
        /// This build's version, as `GET /v1/nodes` shows it.
        public var version: String = ""
        /// Read connections.
        public var readers: Int = 4

        public init(url: String, node: String) {
            self.url = url
            self.node = node
        }
    }

    /// Why the store could not open: the daemon exits 78 (configuration) or 66 (a newer schema).
    public enum OpenFailure: Error, Sendable, CustomStringConvertible {
        case cannotConnect(String)
        case newerSchema(database: Int, known: Int)

        public var description: String {
            switch self {
            case .cannotConnect(let message): "cannot connect to the state database: \(message)"
            case .newerSchema(let database, let known):
                "the state database's schema is version \(database), newer than this daemon knows (\(known)): "
                    + "upgrade this node"
            }
        }
    }

    public let options: Options
    public var node: String { options.node }
    let clock: any Clock
    let writer: PostgresWriter
    let readers: ConnectionPool
    let observers = Locked<[@Sendable (StoreChanges) -> Void]>([])
    /// Tasks started on this node whose lease this node holds, by id: what the heartbeat checks.
    let leased = Locked<Set<String>>([])
    /// The heartbeat's view of the database: when the last beat reached it (monotonic seconds).
    let health = Locked(FleetHealth())
    /// Where this node's transfers stop when its beats do not get through (`LeaseFence`).
    let fence: LeaseFence
    public var leaseFence: LeaseFence? { fence }
    private var feed: PostgresChangeFeed?
    private var heartbeat: WorkerThread?
    private let stopping = Locked(false)
    let figures = Locked(MaintenanceFigures())
    /// Session records as read, for `sessionRecord`; forgotten when a change of them is heard.
    let sessionCache = Locked(SessionCache())
    /// Task sequences taken from the database and not used yet, in descending order (`nextSequence`).
    let sequenceBlock = Locked<[Int64]>([])
    /// What the node says of itself at each beat (`GET /v1/nodes`): running transfers, network JSON.
    let nodeStatus = Locked<@Sendable () -> (running: Int, network: String?)>({ (0, nil) })
    /// Tasks failed by a takeover because their row cannot be read (`reportUnreadable`).
    let unreadable = Locked<@Sendable ([String]) -> Void>({ _ in })

    /// Connects, migrates the schema (under the advisory lock), and registers this node. Throws
    /// `OpenFailure`.
    public init(_ options: Options, clock: any Clock = SystemClock()) throws(OpenFailure) {
        self.options = options
        self.clock = clock
        fence = LeaseFence(lease: options.leaseSeconds)
        let connection: PostgresConnection
        do {
            connection = try PostgresConnection(options.url)
        } catch {
            throw .cannotConnect(error.message)
        }
        do {
            try PostgresSchema.migrate(connection)
        } catch let failure as PostgresSchema.Failure {
            guard case .newerSchema(let database, let known) = failure else { throw .cannotConnect("\(failure)") }
            throw .newerSchema(database: database, known: known)
        } catch {
            throw .cannotConnect("\(error)")
        }
        do {
            // The writer's row for its commits' tokens is there before its first transaction: one
            // lost during its COMMIT then waits for it, rather than find no row.
            try connection.execute(
                "INSERT INTO writer_commits (node, token) VALUES ($1, 0) ON CONFLICT (node) DO NOTHING", [.text(options.node)])
            readers = try ConnectionPool(url: options.url, count: max(1, options.readers), deadline: options.leaseSeconds)
        } catch {
            throw .cannotConnect(error.message)
        }
        do {
            // The writer's own connection, bound as the others are: no call of it waits on a
            // stalled server past a lease (the migrations', which may take long, is not).
            writer = PostgresWriter(
                connection: try PostgresConnection(
                    options.url, deadline: options.leaseSeconds, name: PostgresWriter.connectionName),
                url: options.url,
                node: options.node, callTimeout: options.leaseSeconds)
        } catch {
            throw .cannotConnect(error.message)
        }
        writer.afterCommit = { [observers, sessionCache] changes in
            sessionCache.withLock { $0.forget(changes) }
            for observer in observers.withLock({ $0 }) { observer(changes) }
        }
        writer.settled = { [leased, figures, fence] tx in
            figures.withLock { $0.commits += 1 }
            guard !tx.leasesTaken.isEmpty || !tx.leasesEnded.isEmpty else { return }
            fence.restore(tx.leasesTaken)
            leased.withLock {
                $0.subtract(tx.leasesEnded)
                $0.formUnion(tx.leasesTaken)
            }
        }
        writer.start()
        do {
            try register()
        } catch {
            writer.stop()
            throw .cannotConnect("\(error)")
        }
    }

    /// Starts the threads that hear the other nodes and keep this node's leases: after the
    /// observers are in place (the daemon calls it once its engine listens).
    public func startFleet() {
        let feed = PostgresChangeFeed(
            url: options.url, node: node, runsShared: !options.sharedRoots.isEmpty, lease: options.leaseSeconds
        ) {
            [observers, sessionCache] changes in
            sessionCache.withLock { $0.forget(changes) }
            for observer in observers.withLock({ $0 }) { observer(changes) }
        }
        self.feed = feed
        feed.start()
        let thread = WorkerThread(name: "bh-heartbeat")
        heartbeat = thread
        fence.arm()
        thread.start { [self] in beatUntilStopped() }
    }

    /// What the node says of itself at each beat.
    public func reportStatus(_ status: @escaping @Sendable () -> (running: Int, network: String?)) {
        nodeStatus.withLock { $0 = status }
    }

    public func observe(_ observer: @escaping @Sendable (StoreChanges) -> Void) {
        observers.withLock { $0.append(observer) }
    }

    public func removeFiles(with remover: any FileRemover) { writer.fileRemover.set(remover) }

    /// The node waits on the database until `seconds` from now and the writer's `stopPatience`
    /// more: the writer gives a lost connection up then, and a fenced write waits no longer.
    public func beginStop(within seconds: Double) {
        writer.giveUp(at: monotonicSeconds() + seconds + writer.stopPatience)
    }

    public func close() {
        guard stopping.setOnce() else { return }
        heartbeat?.join()
        feed?.stop()
        writer.stop()
        readers.close()
    }

    deinit { close() }

    public var now: Timestamp { clock.now() }

    /// Whether `close()` was called (the heartbeat's loop ends).
    var isStopping: Bool { stopping.withLock { $0 } }

    /// Waits up to `seconds`, or less when the store closes; whether it is closing.
    func pause(_ seconds: Double) -> Bool {
        stopping.wait(until: { $0 }, timeout: seconds) { $0 }
    }

    // MARK: Reading and writing

    /// Runs `body` in the next write transaction and returns once it committed. `fenced` (the
    /// engine's thread, which drives the transfers): it waits only while the lease fence is open,
    /// so a write stuck on a dead link never holds a transfer past the node's lease, nor a stopping
    /// node past its grace; the write still commits when the database answers (a claim made
    /// meanwhile runs out with its lease).
    @discardableResult
    func write<T>(fenced: Bool = false, _ body: @escaping (PostgresTransaction) throws -> T) throws(StoreError) -> T {
        let box = Locked<Result<T, StoreError>?>(nil)
        writer.submit(
            PostgresWriter.Job(
                durable: true,
                body: { tx in
                    let value = try body(tx)
                    return { box.withLockNotifyingAll { $0 = .success(value) } }
                },
                failed: { error in box.withLockNotifyingAll { $0 = .failure(error) } }))
        // A stopping node's write waits as long as the writer tries (the grace and a moment
        // more), and one made past that a moment (a database that answers commits in
        // milliseconds; one that is gone fails it at once). Read on each turn: the stop may begin
        // while the write waits.
        let patience = monotonicSeconds() + writer.stopPatience
        while fenced, fence.allowsStarting(), monotonicSeconds() < max(writer.giveUpAt, patience) {
            if let result = box.wait(until: { $0 != nil }, timeout: 0.05, { $0 }) { return try result.get() }
        }
        if fenced, box.withLock({ $0 == nil }) {
            throw .unavailable(
                fence.allowsStarting()
                    ? "the node is stopping, and the database has not answered within its grace"
                    : "the database has not answered this node's heartbeat within its lease")
        }
        let result = box.wait(until: { $0 != nil }, timeout: 1e9) { $0! }
        return try result.get()
    }

    /// Returns once every write handed over before it has committed (tests wait on the engine's
    /// writes with it).
    package func settle() throws(StoreError) {
        try write { _ in () }
    }

    /// Hands `body` to the writer without waiting; `done` runs after the commit, in commit order.
    /// Not `durable` (the engine's writes): its commit does not wait for the server's disk.
    func submit<T>(
        durable: Bool = false, _ body: @escaping (PostgresTransaction) throws -> T,
        done: @escaping (Result<T, StoreError>) -> Void
    ) {
        writer.submit(
            PostgresWriter.Job(
                durable: durable,
                body: { tx in
                    let value = try body(tx)
                    return { done(.success(value)) }
                },
                failed: { error in done(.failure(error)) }))
    }

    /// Runs `body` on a read connection (autocommit: each statement sees the last commit).
    public func read<T>(_ body: (PostgresTransaction) throws -> T) throws(StoreError) -> T {
        do {
            return try readers.use { connection in try body(PostgresTransaction(connection, node: node)) }
        } catch {
            throw StoreError(postgres: error)
        }
    }

    // MARK: The store itself

    public var failure: SyncFailure? { nil }
    public var salvage: SalvageReport? { nil }
    public var damage: StateDamage? { nil }
    /// What this node's writer committed and its housekeeping removed (the WAL's and checkpoints'
    /// figures are SQLite's alone).
    public var maintenanceFigures: MaintenanceFigures { figures.withLock { $0 } }

    /// The database answers and this node's heartbeat reached it within a lease.
    public func isWritable() -> Bool {
        guard health.withLock({ $0.isHealthy(lease: options.leaseSeconds) }) else { return false }
        return (try? read { tx in try tx.execute("SELECT 1") }) != nil
    }

    /// A copy of a shared database is the database's own business (`pg_dump`), not one node's.
    public func backup(to path: String) throws(StoreError) -> BackupResult {
        throw .conflict("the state is in PostgreSQL: back it up with pg_dump or the database's own backups")
    }

    /// The writer joins waiting jobs into one transaction on its own; holding adds nothing.
    public func holdWrites() {}
    @discardableResult public func releaseWrites() -> Bool { false }
    public var holdsWrites: Bool { false }
}

/// When the node last reached the database, for `/readyz` and for ending transfers whose leases
/// may have run out.
struct FleetHealth {
    var lastBeat = monotonicSeconds()
    var lastError: String?

    func isHealthy(lease: Double) -> Bool { lastError == nil && monotonicSeconds() - lastBeat < lease }
}

extension StoreError {
    /// What a PostgreSQL call threw, in the store's terms.
    init(postgres error: any Error) {
        switch error {
        case let error as StoreError: self = error
        case let error as ValidationError: self = .invalid(error)
        case let error as PostgresError where error.sqlState == "53100": self = .storageFull
        case let error as PostgresError where error.isConnectionLost || error.isTimeout: self = .unavailable(error.message)
        default: self = .database(String(describing: error))
        }
    }
}

extension PostgresStore: StateStore {}
