import CSQLite
import Glibc

/// An SQLite result code with the library's own message and the SQL that failed.
public struct SQLiteError: Error, Sendable, CustomStringConvertible {
    public var code: Int32
    public var message: String
    public var sql: String?
    /// The errno of the system call behind the error, where there was one (`sqlite3_system_errno`).
    public var systemErrno: Int32

    public init(code: Int32, message: String, sql: String? = nil, systemErrno: Int32 = 0) {
        self.code = code
        self.message = message
        self.sql = sql
        self.systemErrno = systemErrno
    }

    /// The primary result code (extended codes carry it in the low byte).
    public var primaryCode: Int32 { code & 0xFF }
    /// The database or its disk is full (`SQLITE_FULL`), or the file could not be written.
    /// (`SQLITE_IOERR_WRITE` is a macro expression Swift does not import: spelled out.)
    public var isStorageFull: Bool { primaryCode == SQLITE_FULL || code == SQLITE_IOERR | (3 << 8) }
    public var isConstraintViolation: Bool { primaryCode == SQLITE_CONSTRAINT }
    /// An `fsync` of a file or of its directory failed (`SQLITE_IOERR_FSYNC`, `SQLITE_IOERR_DIR_FSYNC`).
    public var isSyncError: Bool { code == SQLITE_IOERR | (4 << 8) || code == SQLITE_IOERR | (5 << 8) }

    public var description: String {
        "SQLite error \(code): \(message)" + (sql.map { " (in \($0))" } ?? "")
    }
}

/// A value bound to or read from a statement.
public enum SQLValue: Sendable, Equatable {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob([UInt8])
}

/// A value bound to a statement's parameter: each kind binds itself (`sqlite3_bind_*`), with no
/// `SQLValue` made first.
public protocol SQLBindable {
    /// Binds the value as parameter `index` of `statement`; `sqlite3_bind_*`'s result code.
    func bind(to statement: Statement, at index: Int32) -> Int32
}
extension Int: SQLBindable {
    public func bind(to statement: Statement, at index: Int32) -> Int32 { statement.bind(Int64(self), at: index) }
}
extension Int64: SQLBindable {
    public func bind(to statement: Statement, at index: Int32) -> Int32 { statement.bind(self, at: index) }
}
extension Double: SQLBindable {
    public func bind(to statement: Statement, at index: Int32) -> Int32 { statement.bind(self, at: index) }
}
extension String: SQLBindable {
    public func bind(to statement: Statement, at index: Int32) -> Int32 { statement.bind(self, at: index) }
}
extension Bool: SQLBindable {
    public func bind(to statement: Statement, at index: Int32) -> Int32 { statement.bind(Int64(self ? 1 : 0), at: index) }
}
extension SQLValue: SQLBindable {
    public func bind(to statement: Statement, at index: Int32) -> Int32 { statement.bind(self, at: index) }
}
extension Optional: SQLBindable where Wrapped: SQLBindable {
    public func bind(to statement: Statement, at index: Int32) -> Int32 {
        guard let self else { return statement.bindNull(at: index) }
        return self.bind(to: statement, at: index)
    }
}

/// One open database (`sqlite3_open_v2`). Used from one thread at a time; not Sendable.
public final class Connection {
    let handle: OpaquePointer
    /// Looked up for every statement, by one thread at a time: no runtime exclusivity check.
    @exclusivity(unchecked) private var statementCache: [SQLText: Statement] = [:]
    /// Kept alive while the hook is set.
    private var walHook: WALHook?

    /// Opens (creating if needed) the database at `path`; ":memory:" for a private in-memory one.
    /// `readOnly` opens an existing database for reading only. Files go through SQLite's default VFS.
    public init(path: String, readOnly: Bool = false) throws(SQLiteError) {
        Connection.configureLibrary
        var db: OpaquePointer?
        let flags = (readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) | SQLITE_OPEN_NOMUTEX
        let code = sqlite3_open_v2(path, &db, flags, nil)
        guard code == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "cannot open"
            if let db { sqlite3_close_v2(db) }
            throw SQLiteError(code: code, message: message)
        }
        handle = db
        sqlite3_extended_result_codes(db, 1)
        sqlite3_busy_timeout(db, 5_000)
    }

    /// Process-wide settings, made once before the first connection opens (SQLite takes them only
    /// before it initializes). Memory statistics off: nothing here reads them, and keeping them took
    /// a global mutex on each of the 140 allocations and frees of a task, 14,000 instructions.
    private static let configureLibrary: Void = {
        let code = bh_sqlite3_disable_memstatus()
        assert(code == SQLITE_OK, "SQLite was initialized before its settings were made")
    }()

    /// The bytes SQLite counts as allocated (`sqlite3_memory_used`): 0 while its statistics are
    /// off, as they are once a connection has opened.
    public static var memoryCounted: Int64 { sqlite3_memory_used() }

    deinit {
        statementCache.removeAll()
        sqlite3_close_v2(handle)
    }

    /// Runs one or more statements that return no rows (`sqlite3_exec`).
    public func execute(_ sql: String) throws(SQLiteError) {
        var errorMessage: UnsafeMutablePointer<CChar>?
        let code = sqlite3_exec(handle, sql, nil, nil, &errorMessage)
        if code != SQLITE_OK {
            let message = errorMessage.map { String(cString: $0) } ?? lastErrorMessage
            sqlite3_free(errorMessage)
            throw SQLiteError(code: code, message: message, sql: sql)
        }
    }

    /// A prepared statement, cached by its SQL text and reset for reuse.
    public func prepare(_ sql: String) throws(SQLiteError) -> Statement {
        let key = SQLText(sql)
        if let cached = statementCache[key] {
            cached.reset()
            return cached
        }
        let statement = try Statement(connection: self, sql: sql)
        statementCache[key] = statement
        return statement
    }

    /// Runs `sql` with `arguments`, discarding rows; returns the number of changed rows.
    @discardableResult
    public func run(_ sql: String, _ arguments: [any SQLBindable] = []) throws(SQLiteError) -> Int {
        let statement = try prepare(sql)
        try statement.bind(arguments)
        while try statement.step() {}
        return Int(sqlite3_changes(handle))
    }

    /// Runs a query and maps every row.
    public func query<T>(_ sql: String, _ arguments: [any SQLBindable] = [], _ map: (Row) throws -> T) throws -> [T] {
        let statement = try prepare(sql)
        try statement.bind(arguments)
        var result: [T] = []
        while try statement.step() { result.append(try map(Row(statement: statement))) }
        statement.reset()
        return result
    }

    /// The first row of a query, mapped, or nil.
    public func queryFirst<T>(_ sql: String, _ arguments: [any SQLBindable] = [], _ map: (Row) throws -> T) throws -> T? {
        let statement = try prepare(sql)
        try statement.bind(arguments)
        defer { statement.reset() }
        return try statement.step() ? try map(Row(statement: statement)) : nil
    }

    public var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(handle) }

    /// Runs `body` inside `BEGIN IMMEDIATE … COMMIT`, rolling back when it throws.
    public func transaction<T>(_ body: () throws -> T) throws -> T {
        try enclosed(begin: "BEGIN IMMEDIATE", end: ["COMMIT"], undo: ["ROLLBACK"], body)
    }

    /// Runs `body` inside a savepoint of the open transaction: when it throws, only its own
    /// changes are undone.
    public func savepoint<T>(_ body: () throws -> T) throws -> T {
        try enclosed(begin: "SAVEPOINT nested", end: ["RELEASE nested"], undo: ["ROLLBACK TO nested", "RELEASE nested"], body)
    }

    /// `begin`, then `body`, then `end`; `undo` when `body` or `end` throws.
    private func enclosed<T>(begin: String, end: [String], undo: [String], _ body: () throws -> T) throws -> T {
        try run(begin)
        do {
            let result = try body()
            for statement in end { try run(statement) }
            return result
        } catch {
            for statement in undo { _ = try? run(statement) }
            throw error
        }
    }

    /// Defines an SQL function `name()` of no arguments that calls `body` and returns NULL: for a
    /// TEMP trigger that tells this process a table changed (`sqlite3_create_function_v2`).
    public func defineFunction(_ name: String, _ body: @escaping () -> Void) throws(SQLiteError) {
        let box = Unmanaged.passRetained(FunctionBody(body)).toOpaque()
        let code = sqlite3_create_function_v2(
            handle, name, 0, SQLITE_UTF8, box,
            { context, _, _ in
                guard let context, let pointer = sqlite3_user_data(context) else { return }
                Unmanaged<FunctionBody>.fromOpaque(pointer).takeUnretainedValue().body()
                sqlite3_result_null(context)
            }, nil, nil,
            { pointer in
                guard let pointer else { return }
                Unmanaged<FunctionBody>.fromOpaque(pointer).release()
            })
        guard code == SQLITE_OK else { throw SQLiteError(code: code, message: lastErrorMessage) }
    }

    /// Calls `body` after each commit in WAL mode with the number of frames now in the WAL
    /// (`sqlite3_wal_hook`); the automatic checkpoint is off while a hook is set.
    public func onWALCommit(_ body: @escaping (Int) -> Void) {
        walHook = WALHook(body)
        let box = Unmanaged.passUnretained(walHook!).toOpaque()
        sqlite3_wal_hook(
            handle,
            { userdata, _, _, frames in
                guard let userdata else { return SQLITE_OK }
                Unmanaged<WALHook>.fromOpaque(userdata).takeUnretainedValue().body(Int(frames))
                return SQLITE_OK
            }, box)
    }

    /// Rows changed by the last statement (`sqlite3_changes`).
    public var changes: Int { Int(sqlite3_changes(handle)) }

    /// `PRAGMA wal_checkpoint(mode)`: the WAL's frames and how many were copied back, or nil when
    /// the checkpoint could not run (busy).
    public func checkpoint(_ mode: CheckpointMode) throws(SQLiteError) -> (frames: Int, copied: Int)? {
        var frames: Int32 = 0
        var copied: Int32 = 0
        let code = sqlite3_wal_checkpoint_v2(handle, nil, mode.rawValue, &frames, &copied)
        if code == SQLITE_BUSY { return nil }
        guard code == SQLITE_OK else {
            throw SQLiteError(code: code, message: lastErrorMessage, systemErrno: sqlite3_system_errno(handle))
        }
        return (Int(frames), Int(copied))
    }

    public enum CheckpointMode: Int32, Sendable {
        case passive = 0
        case full = 1
        case restart = 2
        case truncate = 3
    }

    /// True while a transaction is open (`sqlite3_get_autocommit` is 0).
    public var inTransaction: Bool { sqlite3_get_autocommit(handle) == 0 }

    var lastErrorMessage: String { String(cString: sqlite3_errmsg(handle)) }
}

/// The statement cache's key: SQL text, hashed eight bytes at a time by a multiply-rotate mix
/// instead of SipHash over every byte. A lookup runs for every statement, and the SQL of a task's
/// row is several hundred bytes long: SipHash cost 2,500 instructions a lookup. Equal keys still
/// compare the whole text.
private struct SQLText: Hashable {
    let text: String
    let digest: UInt64

    init(_ text: String) {
        self.text = text
        var text = text
        digest = text.withUTF8 { bytes in
            let raw = UnsafeRawBufferPointer(bytes)
            var hash = UInt64(truncatingIfNeeded: raw.count) &* 0x9E37_79B9_7F4A_7C15
            func mix(_ word: UInt64) {
                hash = (hash ^ word) &* 0xFF51_AFD7_ED55_8CCD
                hash ^= hash >> 29
            }
            var offset = 0
            while offset + 8 <= raw.count {
                mix(raw.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
                offset += 8
            }
            var tail: UInt64 = 0
            while offset < raw.count {
                tail = tail << 8 | UInt64(raw[offset])
                offset += 1
            }
            mix(tail)
            return hash
        }
    }

    static func == (lhs: SQLText, rhs: SQLText) -> Bool { lhs.digest == rhs.digest && lhs.text == rhs.text }

    func hash(into hasher: inout Hasher) { hasher.combine(digest) }
}

/// The Swift side of `onWALCommit`.
private final class WALHook {
    let body: (Int) -> Void
    init(_ body: @escaping (Int) -> Void) { self.body = body }
}

/// The Swift side of a function defined with `defineFunction`.
private final class FunctionBody {
    let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
}
