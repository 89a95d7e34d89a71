import BackhaulCore
import BackhaulQueue
import Glibc
import JSONCodec
import SQLite
import Threads

/// What went wrong in the store outside any one write, for the daemon to log and act on.
public enum StoreIncident: Sendable {
    /// A sync failed: the store refuses every write from now on, and the process must start over.
    case failedClosed(SyncFailure)
    /// A checkpoint failed; it is tried again later (and one whose sync failed also fails the
    /// store closed).
    case checkpointFailed(CheckpointFailure)
    /// SQLite found the database damaged while it was open (once, the first time: `StateDamage`).
    case damaged(StateDamage)
    /// The background check of every page (`IntegrityScan`) went through every table and found
    /// nothing: how many tables, and the seconds it checked and rested.
    case checked(tables: Int, seconds: Double)
}

/// The durable state: one SQLite database in WAL mode. One connection writes, on a thread of its
/// own, joining concurrent writes into one transaction (`StoreWriter`); a pool of read-only
/// connections serves reads beside it (`ReaderPool`). Every state change and its events are one
/// transaction; what a commit changed goes to the observers (`StoreChanges`).
public final class Store: Sendable {
    /// How a write must reach the disk before it returns.
    public enum Durability: Sendable {
        /// On disk before it returns (the WAL synced after the commit): for what a client is told
        /// was accepted or done.
        case synced
        /// Committed without waiting for the disk: safe against a crash of the process.
        /// For the engine's own bookkeeping, where losing the last moments to a power cut only
        /// repeats work (an upload runs again).
        case relaxed
    }

    let writer: StoreWriter
    /// The changes of the open transaction; touched on the writer's thread only.
    nonisolated(unsafe) let recorder: ChangeRecorder
    /// What the writer remembers between transactions; touched on the writer's thread only.
    nonisolated(unsafe) let writerState = WriterState()
    private let readers: ReaderPool
    private let clock: any Clock
    /// The database file, and whether it is a scratch file of `Store(path: ":memory:")`.
    public let path: String
    private let scratch: Bool
    /// How the WAL is kept bounded (see `Store+Maintenance`).
    let walPolicy: WALPolicy
    let maintenance = Locked(MaintenanceFigures())
    /// Copies the WAL back, and keeps it bounded, without holding the writer (`Checkpointer`).
    let checkpointer: Checkpointer
    /// Session records as committed, for the reads of every request that creates tasks.
    let sessionCache = Locked(SessionCache())
    private let closed = Locked(false)
    /// The salvage this open made of a damaged database (`StoreSalvage`), else the newest one an
    /// earlier start recorded in the state directory (`isNew` tells which); nil when none.
    public let salvage: SalvageReport?
    /// Damage found since the open (`StateDamage`).
    let damageWatch: DamageWatch
    /// The page check the open skipped after a clean stop, running in the background; nil when
    /// the open read every page.
    private let integrityScan: IntegrityScan?
    /// Whether `close` may leave the clean-stop mark: from the open on, or from `started()` when
    /// the open was `awaitingStart`.
    private let startCompleted: Locked<Bool>

    /// Opens (creating, or migrating after a backup copy) the database at `path`. ":memory:"
    /// gives a scratch database, removed when the store is closed (tests). A database SQLite
    /// finds damaged is salvaged or refused, as `onCorruptState` says (`StoreSalvage`); one that
    /// cannot be salvaged now throws `SalvageFailure`. `knownDamage`: damage an earlier attempt of
    /// this start found, salvaged even if the check of every page finds none. `awaitingStart`:
    /// `close` leaves no clean-stop mark until `started()`, so a start that fails leaves none.
    /// `report` hears of what went wrong outside a write (on the thread that found it).
    public init(
        path: String, clock: any Clock = SystemClock(), readers: Int = 4, walPolicy: WALPolicy = WALPolicy(),
        onCorruptState: CorruptStatePolicy = .refuse, knownDamage: String? = nil, awaitingStart: Bool = false,
        report: @escaping @Sendable (StoreIncident) -> Void = { _ in }
    ) throws {
        scratch = path == ":memory:"
        self.path = scratch ? "/tmp/backhaul-scratch-\(getpid())-\(RandomID.make(prefix: "", at: clock.now())).db" : path
        self.clock = clock
        self.walPolicy = walPolicy
        startCompleted = Locked(!awaitingStart)
        let cleanlyStopped = scratch ? false : try CleanStop.take(beside: self.path)
        salvage = try StoreSalvage.examine(
            path: self.path, policy: onCorruptState, now: clock.now(), thorough: !cleanlyStopped, knownDamage: knownDamage)
        let damageWatch = DamageWatch { report(.damaged($0)) }
        self.damageWatch = damageWatch
        integrityScan =
            cleanlyStopped
            ? IntegrityScan(path: self.path, watch: damageWatch, clock: clock) { report(.checked(tables: $0, seconds: $1)) } : nil
        let db = try Connection(path: self.path)
        try db.execute("PRAGMA journal_mode = WAL")
        try db.execute("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY")
        // The store checkpoints on its own terms (`Store+Maintenance`): the automatic one can be
        // starved by busy readers and lets the WAL grow.
        try db.execute("PRAGMA journal_size_limit = \(walPolicy.journalSizeLimit)")
        try StoreOpening.migrate(db, path: self.path)
        try Store.verify(db)
        recorder = ChangeRecorder(state: writerState)
        try Store.installWebhookFeed(db, state: writerState)
        self.readers = try ReaderPool(path: self.path, count: max(1, readers))
        // The migrations above ran with `synchronous = FULL`. From here commits do not wait for the
        // disk; the writer's settler syncs the WAL before it answers a durable write (`StoreWriter`).
        try db.execute("PRAGMA synchronous = NORMAL")
        // The database file's own name reaches the disk before anything is acknowledged.
        if !scratch, let failure = syncDirectory(of: self.path) { throw StoreError.syncFailed(failure) }
        let databasePath = self.path
        let writer = StoreWriter(connection: db, recorder: recorder, walPath: databasePath + "-wal") { [maintenance] error in
            guard case .syncFailed(let failure) = error else { return }
            maintenance.withLock { $0.syncFailures += 1 }
            report(.failedClosed(failure))
        }
        self.writer = writer
        writer.onError = { [clock] error in damageWatch.note(error, foundBy: "a write", at: clock.now()) }
        let frames = FrameCount()
        db.onWALCommit { frames.value = $0 }
        // A checkpoint whose sync failed fails the store as the settler's own sync does.
        let checkpointFailed: @Sendable (CheckpointFailure) -> Void = { failure in
            report(.checkpointFailed(failure))
            if let sync = failure.syncFailure(path: databasePath) { writer.fail(.syncFailed(sync)) }
        }
        let checkpointer = try Checkpointer(
            path: self.path, policy: walPolicy, figures: maintenance, report: checkpointFailed)
        self.checkpointer = checkpointer
        writer.afterCommit = { [walPolicy, maintenance] db, synced in
            Store.keepWALBounded(
                db, walPolicy, maintenance, checkpointer, frames: frames.value, synced: synced, report: checkpointFailed)
        }
        writer.observe { [sessionCache] changes in
            sessionCache.withLock { $0.forget(changes) }
        }
        checkpointer.start()
        writer.start()
        integrityScan?.start()
    }

    /// The start this store was opened for (`awaitingStart`) completed: `close` may leave the
    /// clean-stop mark from now on.
    public func started() { startCompleted.withLock { $0 = true } }

    /// The damage SQLite found in the database since it was opened, or nil.
    public var damage: StateDamage? { damageWatch.damage }

    /// A local file is not a peer that can stop answering: its writes are waited for.
    public func beginStop(within seconds: Double) {}

    /// Stops the writer after the writes handed to it; a scratch database is removed. Closing
    /// again does nothing.
    public func close() {
        guard closed.setOnce() else { return }
        writer.stop()
        checkpointer.stop()
        let checked = integrityScan?.stop() ?? true
        // The whole WAL back into the database file, which is then the state on its own; the next
        // open may then skip reading every page for damage: unless this start failed, found damage,
        // or had not yet checked in the background the pages its open skipped.
        let clean = checked && damage == nil && startCompleted.withLock { $0 }
        if (try? writer.emptyLog()) == true, !scratch, clean { CleanStop.mark(beside: path) }
        if scratch { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
    }

    deinit { close() }

    /// Calls `observer` after each commit that changed something, in commit order, once it is on
    /// disk when the commit had to wait for that (`StoreWriter`); on the store's writer or settler
    /// thread, so `observer` must not wait for a write.
    public func removeFiles(with remover: any FileRemover) { writer.fileRemover.set(remover) }

    public func observe(_ observer: @escaping @Sendable (StoreChanges) -> Void) {
        writer.observe(observer)
    }

    public var now: Timestamp { clock.now() }

    // MARK: Reading and writing

    /// Runs `body` in the next write transaction and returns once it committed (fsync'd when
    /// `synced`). A throw undoes `body`'s writes only.
    @discardableResult
    func write<T>(_ durability: Durability = .synced, _ body: @escaping (Connection) throws -> T) throws(StoreError) -> T {
        try writer.perform(durable: durability == .synced) { db, _ in try body(db) }
    }

    /// Hands `body` to the writer without waiting (relaxed durability); `done` runs after the
    /// commit, in commit order (on the store's writer or settler thread), with the result.
    public func submit<T>(_ body: @escaping (Connection) throws -> T, done: @escaping (Result<T, StoreError>) -> Void) {
        let box = ResultBox<T>()
        writer.submit(
            StoreWriter.Job(
                durable: false, body: { db, _ in box.value = try body(db) },
                done: { error in
                    if let error { done(.failure(error)) } else if let value = box.value { done(.success(value)) }
                }))
    }

    /// The calling thread's writes wait, from now until `releaseWrites`, and then go to the
    /// writer together (the engine's turn: see `StoreWriter.hold`).
    public func holdWrites() { writer.hold() }

    /// Whether any writes were held (and went).
    @discardableResult
    public func releaseWrites() -> Bool { writer.release() }

    /// Whether the calling thread holds writes it has not released yet.
    public var holdsWrites: Bool { writer.holdsJobs }

    /// Runs `body` on a read connection: it sees the last commit and waits for no writer.
    public func read<T>(_ body: (Connection) throws -> T) throws(StoreError) -> T {
        do {
            return try readers.read(body)
        } catch let error as StoreError {
            throw error
        } catch {
            damageWatch.note(error, foundBy: "a read", at: now)
            throw .database(String(describing: error))
        }
    }

    /// The sync failure the store failed closed on, or nil while it takes writes.
    public var failure: SyncFailure? {
        if case .syncFailed(let failure) = writer.failedWith { return failure }
        return nil
    }

    /// Checks the database answers and can be written (for `/readyz`).
    public func isWritable() -> Bool {
        guard writer.failedWith == nil else { return false }
        return (try? write { db in try db.run("CREATE TEMP TABLE IF NOT EXISTS readiness (x); DELETE FROM readiness") }) != nil
    }

    // MARK: Opening

    /// Refuses a database whose tasks are in states this build does not know (read from the
    /// per-session counts, so it costs nothing however many tasks there are).
    static func verify(_ db: Connection) throws {
        for name in try db.query("SELECT DISTINCT state FROM session_counts WHERE count != 0", [], { $0.string(0) })
        where TaskState(rawValue: name) == nil {
            throw StoreError.corrupt("tasks are in the state \(name), which this build does not know")
        }
    }
}

/// What the writer keeps between its transactions (its thread only).
final class WriterState {
    /// Running tasks a client changed (PATCH) since they started: their end reads the row again
    /// rather than trust the engine's copy.
    var patchedWhileRunning: Set<Int64> = []
    /// The sessions with an enabled webhook subscription, or nil when a write to `webhooks` made
    /// it unknown (a TEMP trigger says so, `installWebhookFeed`): an event of any other session
    /// needs no delivery rows, and the statement that would find none is not run.
    var sessionsWithWebhooks: Set<String>?
    /// Queued tasks whose row changed since they were created (kept by `TaskFeed`): a claim of one
    /// reads the row again instead of trusting the copy the engine holds.
    var touchedQueued: Set<Int64> = []
}

/// The WAL's frames after the last commit, written and read on the writer's thread.
private final class FrameCount: @unchecked Sendable {
    var value = 0
}

/// A submitted job's value, set on the writer's thread before its `done` runs (there, or on the
/// settler's after the hand-over under a lock).
private final class ResultBox<T>: @unchecked Sendable {
    var value: T?
}
