import BackhaulCore
import Threads
import Glibc
import JSONCodec
import SQLite

/// What the store refuses, in the API's terms.
public enum StoreError: Error, Sendable, Equatable {
    case notFound
    case sessionExists
    case conflict(String)
    /// The state directory is full: nothing was written.
    case storageFull
    /// A change the caller applied inside the transaction refused the record: nothing was written.
    case invalid(ValidationError)
    /// The session already holds `open` unfinished tasks and may hold at most `limit`.
    case tooManyTasks(open: Int, limit: Int)
    /// A stored record cannot be read back: the database was changed outside this program, or by
    /// a build that wrote what this one does not understand. Never replaced by a default.
    case corrupt(String)
    case database(String)
}

/// An event written in the same transaction as the state change that caused it (SPEC §2.4).
public struct EventRecord: Sendable, Equatable {
    public var sequence: Int64
    public var id: String
    public var type: String
    public var sessionID: String
    public var taskID: String?
    public var createdAt: Timestamp
    public var data: JSON

    /// The Standard Webhooks payload: `{"type","timestamp","data"}`.
    public var payload: JSON {
        ["type": .string(type), "timestamp": .string(RFC3339.format(createdAt)), "data": data]
    }
}

/// A page of a session's tasks.
public struct TaskPage: Sendable {
    public var tasks: [TaskRecord]
    public var nextCursor: String?
}

/// A number changed only under the store's lock.
final class Counter: @unchecked Sendable {
    var value = 0
}

/// Paths collected only under the store's lock.
final class PathList: @unchecked Sendable {
    var paths: [String] = []

    /// Removes the `.part` file of each download collected, and forgets them.
    func removePartFiles() {
        for path in paths { unlink(DownloadSpec.partPath(of: path)) }
        paths.removeAll()
    }
}

/// The durable state: one SQLite database in WAL mode, one connection behind a lock.
/// Every state change and its event are one transaction.
public final class Store: Sendable {
    /// The one connection and what is known about its state.
    struct Link {
        let db: Connection
        /// Bumped (by TEMP triggers) whenever a task enters the queue or a queued task changes
        /// host: the scheduler's cue that a queue it found empty may not be any more.
        let queueChanges = Counter()
        /// Destinations of downloads that ended without completing in the open transaction:
        /// their `.part` files are removed once it commits.
        let endedDownloads = PathList()
        /// The `synchronous` level now set, so that it is changed only when a write needs another.
        var relaxed = false
        /// The thread running a `batch`; other threads wait for it to end.
        var batchOwner: pthread_t?
        /// Whether the batch has begun its transaction (at its first write: a batch that writes
        /// nothing costs nothing).
        var batchBegun = false

        var inOwnBatch: Bool { batchOwner.map { pthread_equal($0, pthread_self()) != 0 } ?? false }

        mutating func setDurability(_ durability: Durability) throws {
            let relaxed = durability == .relaxed
            guard relaxed != self.relaxed else { return }
            try db.execute(relaxed ? "PRAGMA synchronous = NORMAL" : "PRAGMA synchronous = FULL")
            self.relaxed = relaxed
        }
    }

    /// The one connection, used only while its lock is held and no other thread's batch is open:
    /// one writer at a time.
    private let connection: Locked<Link>
    private let clock: any Clock
    /// The last event sequence seen after a write, and who to tell about new events.
    private let eventWatch = Locked<(last: Int64, observers: [@Sendable () -> Void])>((0, []))

    /// Opens (creating and migrating) the database at `path`; ":memory:" for tests.
    public init(path: String, clock: any Clock = SystemClock()) throws {
        let db = try Connection(path: path)
        if path != ":memory:" {
            try db.execute("PRAGMA journal_mode = WAL")
        }
        try db.execute("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY")
        try Migrator(migrations: Schema.migrations).migrate(db)
        try Store.verify(db)
        let last = try Store.lastEventSequence(db)
        let link = Link(db: db)
        try db.defineFunction("backhaul_queue_changed") { [counter = link.queueChanges] _ in counter.value &+= 1 }
        try db.defineFunction("backhaul_download_ended", arguments: 1) { [list = link.endedDownloads] values in
            if let path = values.first ?? nil { list.paths.append(path) }
        }
        try db.execute(
            """
            CREATE TEMP TRIGGER download_ended AFTER UPDATE OF state ON main.tasks
            WHEN NEW.kind = 'download' AND NEW.state IN ('failed', 'cancelled') AND OLD.state NOT IN ('failed', 'cancelled', 'completed')
            BEGIN SELECT backhaul_download_ended(NEW.file_path); END;
            CREATE TEMP TRIGGER queue_insert AFTER INSERT ON main.tasks WHEN NEW.state = 'queued'
            BEGIN SELECT backhaul_queue_changed(); END;
            CREATE TEMP TRIGGER queue_update AFTER UPDATE OF state, host_key ON main.tasks
            WHEN NEW.state = 'queued' AND (OLD.state IS NOT 'queued' OR OLD.host_key IS NOT NEW.host_key)
            BEGIN SELECT backhaul_queue_changed(); END
            """)
        connection = Locked(link)
        self.clock = clock
        eventWatch.withLock { $0.last = last }
    }

    /// Refuses a database whose tasks are in states this build does not know (read from the
    /// per-session counts, so it costs nothing however many tasks there are).
    static func verify(_ db: Connection) throws {
        for name in try db.query("SELECT DISTINCT state FROM session_counts WHERE count != 0", [], { $0.string(0) })
        where TaskState(rawValue: name) == nil {
            throw StoreError.corrupt("tasks are in the state \(name), which this build does not know")
        }
    }

    /// A number that changes whenever a task may have become runnable: one enters the queue,
    /// or a queued one changes host. Equal numbers mean the queue gained nothing in between.
    public var queueVersion: Int {
        access { $0.queueChanges.value }
    }

    /// Calls `observer` (on the writing thread, after the commit) whenever a write added events.
    public func observeEvents(_ observer: @escaping @Sendable () -> Void) {
        eventWatch.withLock { $0.observers.append(observer) }
    }

    /// How a write must reach the disk before it returns.
    enum Durability {
        /// fsync on commit (`synchronous=FULL`): for what a client is told was accepted or done.
        case synced
        /// No fsync on commit (`synchronous=NORMAL`, WAL): safe against a crash of the process, and
        /// the next synced commit flushes it too. For the engine's own bookkeeping, where losing the
        /// last moments to a power cut only repeats work (an upload runs again).
        case relaxed
    }

    /// Runs `body` in one write transaction, mapping storage errors to the API's. Inside this
    /// thread's `batch` it runs in a savepoint of the batch's transaction instead.
    @discardableResult
    func write<T: Sendable>(_ durability: Durability = .synced, _ body: (Connection) throws -> T) throws(StoreError) -> T {
        do {
            let (result, lastEvent) = try access { link in
                let db = link.db
                let result: T
                if link.inOwnBatch {
                    assert(durability == .relaxed, "a batch commits without fsync: synced writes do not belong in one")
                    if !link.batchBegun {
                        try link.setDurability(.relaxed)
                        try db.run("BEGIN IMMEDIATE")
                        link.batchBegun = true
                    }
                    // A write undone inside the batch takes back the removals it asked for.
                    let mark = link.endedDownloads.paths.count
                    do {
                        result = try db.savepoint { try body(db) }
                    } catch {
                        link.endedDownloads.paths.removeSubrange(mark...)
                        throw error
                    }
                } else {
                    try link.setDurability(durability)
                    do {
                        result = try db.transaction { try body(db) }
                    } catch {
                        link.endedDownloads.paths.removeAll()
                        throw error
                    }
                    link.endedDownloads.removePartFiles()
                }
                return (result, try Store.lastEventSequence(db))
            }
            let observers: [@Sendable () -> Void] = eventWatch.withLock { watch in
                guard lastEvent > watch.last else { return [] }
                watch.last = lastEvent
                return watch.observers
            }
            for observer in observers { observer() }
            return result
        } catch let error as StoreError {
            throw error
        } catch let error as ValidationError {
            throw .invalid(error)
        } catch let error as SQLiteError where error.isStorageFull {
            throw .storageFull
        } catch {
            throw .database(String(describing: error))
        }
    }

    func read<T: Sendable>(_ body: (Connection) throws -> T) throws(StoreError) -> T {
        do {
            return try access { link in try body(link.db) }
        } catch let error as StoreError {
            throw error
        } catch {
            throw .database(String(describing: error))
        }
    }

    /// The connection, once no other thread's batch is open.
    private func access<T, E: Error>(_ body: (inout Link) throws(E) -> T) throws(E) -> T {
        try connection.withLock(when: { $0.batchOwner == nil || $0.inOwnBatch }, body)
    }

    /// Runs `body` with the engine's writes made on this thread joined into one transaction,
    /// committed without fsync (`Durability.relaxed`) when it returns: one commit for all the
    /// attempts a loop turn starts or ends instead of one each. Each write inside still runs in
    /// its own savepoint, so one that fails undoes only itself. Other threads wait for the commit.
    /// Throws when the commit fails: then none of the writes inside happened.
    public func batch(_ body: () -> Void) throws(StoreError) {
        let opened = access { link in
            guard !link.inOwnBatch else { return false }
            link.batchOwner = pthread_self()
            return true
        }
        body()
        guard opened else { return }
        let (failure, lastEvent): (SQLiteError?, Int64) = connection.withLockNotifyingAll { link in
            link.batchOwner = nil
            guard link.batchBegun else { return (nil, 0) }
            link.batchBegun = false
            do throws(SQLiteError) {
                try link.db.run("COMMIT")
                link.endedDownloads.removePartFiles()
                return (nil, 0)
            } catch {
                link.endedDownloads.paths.removeAll()
                _ = try? link.db.run("ROLLBACK")
                return (error, (try? Store.lastEventSequence(link.db)) ?? 0)
            }
        }
        guard let failure else { return }
        // The events written inside were undone with the rest: watch from what is really there.
        eventWatch.withLock { $0.last = lastEvent }
        throw failure.isStorageFull ? .storageFull : .database(String(describing: failure))
    }

    /// Checks the database answers and can be written (for `/readyz`).
    public func isWritable() -> Bool {
        (try? write { db in try db.run("CREATE TEMP TABLE IF NOT EXISTS readiness (x); DELETE FROM readiness") }) != nil
    }

    // MARK: Events

    /// Appends an event and, in the same transaction, a pending delivery for every enabled
    /// subscription of the session that wants it (the outbox).
    static func appendEvent(_ db: Connection, type: String, sessionID: String, task: TaskRecord?, data: JSON,
                            now: Timestamp) throws {
        try db.run(
            "INSERT INTO events (id, type, session_id, task_id, created_at, data) VALUES (?, ?, ?, ?, ?, ?)",
            [RandomID.make(prefix: "msg_"), type, sessionID, task?.id, now, data.serialized()])
        let eventSequence = db.lastInsertRowID
        let subscribers = try db.query(
            "SELECT id, events FROM webhooks WHERE session_id = ? AND enabled = 1", [sessionID]) { ($0.string(0), $0.string(1)) }
        for (webhookID, events) in subscribers {
            let wanted = (try? JSON.parse(events))?.arrayValue?.contains(.string(type)) ?? false
            guard wanted else { continue }
            try db.run(
                """
                INSERT INTO deliveries (webhook_id, event_seq, event_type, state, next_attempt_at, created_at)
                VALUES (?, ?, ?, 'pending', ?, ?)
                """, [webhookID, eventSequence, type, now, now])
        }
    }

    /// The newest event's sequence (0 when there is none).
    public func lastEventSequence() throws(StoreError) -> Int64 {
        try read { db in try Store.lastEventSequence(db) }
    }

    static func lastEventSequence(_ db: Connection) throws -> Int64 {
        try db.queryFirst("SELECT COALESCE(MAX(seq), 0) FROM events") { $0.int(0) } ?? 0
    }

    /// Events after `sequence`, oldest first, optionally for one session.
    public func events(after sequence: Int64, session: String? = nil, limit: Int = 500) throws(StoreError) -> [EventRecord] {
        try read { db in
            let map: (Row) throws -> EventRecord = { row in
                EventRecord(sequence: row.int(0), id: row.string(1), type: row.string(2), sessionID: row.string(3),
                            taskID: row.optionalString(4), createdAt: row.double(5),
                            data: (try? JSON.parse(row.string(6), maxDepth: 64)) ?? .null)
            }
            let columns = "seq, id, type, session_id, task_id, created_at, data"
            if let session {
                return try db.query("SELECT \(columns) FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                                    [session, sequence, limit], map)
            }
            return try db.query("SELECT \(columns) FROM events WHERE seq > ? ORDER BY seq LIMIT ?", [sequence, limit], map)
        }
    }

    var now: Timestamp { clock.now() }
}
