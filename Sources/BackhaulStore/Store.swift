import BackhaulCore
import JSON
import SQLite
import Synchronization

/// What the store refuses, in the API's terms.
public enum StoreError: Error, Sendable, Equatable {
    case notFound
    case sessionExists
    case conflict(String)
    /// The state directory is full: nothing was written.
    case storageFull
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

/// The durable state: one SQLite database in WAL mode, one connection behind a lock.
/// Every state change and its event are one transaction.
public final class Store: Sendable {
    /// Serialises every use of `connection`.
    private let lock = Mutex(())
    // Touched only while `lock` is held: one connection, one writer at a time.
    private nonisolated(unsafe) let connection: Connection
    private let clock: any Clock

    /// Opens (creating and migrating) the database at `path`; ":memory:" for tests.
    public init(path: String, clock: any Clock = SystemClock()) throws {
        let db = try Connection(path: path)
        if path != ":memory:" {
            try db.execute("PRAGMA journal_mode = WAL")
        }
        try db.execute("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY")
        try Migrator(migrations: Schema.migrations).migrate(db)
        connection = db
        self.clock = clock
    }

    /// Runs `body` in one write transaction, mapping storage errors to the API's.
    func write<T: Sendable>(_ body: (Connection) throws -> T) throws(StoreError) -> T {
        do {
            return try lock.withLock { _ in try connection.transaction { try body(connection) } }
        } catch let error as StoreError {
            throw error
        } catch let error as SQLiteError where error.isStorageFull {
            throw .storageFull
        } catch {
            throw .database(String(describing: error))
        }
    }

    func read<T: Sendable>(_ body: (Connection) throws -> T) throws(StoreError) -> T {
        do {
            return try lock.withLock { _ in try body(connection) }
        } catch let error as StoreError {
            throw error
        } catch {
            throw .database(String(describing: error))
        }
    }

    /// Checks the database answers and can be written (for `/readyz`).
    public func isWritable() -> Bool {
        (try? write { db in try db.run("CREATE TEMP TABLE IF NOT EXISTS readiness (x); DELETE FROM readiness") }) != nil
    }

    // MARK: Events

    static func appendEvent(_ db: Connection, type: String, sessionID: String, task: TaskRecord?, data: JSON,
                            now: Timestamp) throws {
        try db.run(
            "INSERT INTO events (id, type, session_id, task_id, created_at, data) VALUES (?, ?, ?, ?, ?, ?)",
            [RandomID.make(prefix: "msg_"), type, sessionID, task?.id, now, data.serialized()])
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
