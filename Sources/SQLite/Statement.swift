import CSQLite

/// A prepared statement (`sqlite3_prepare_v3`), owned by its connection's cache.
public final class Statement {
    private let pointer: OpaquePointer
    private unowned let connection: Connection
    public let sql: String
    /// The bytes of the text and blob arguments bound last.
    private let bound = ArgumentBuffer()

    init(connection: Connection, sql: String) throws(SQLiteError) {
        var statement: OpaquePointer?
        let code = sqlite3_prepare_v3(connection.handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard code == SQLITE_OK, let statement else {
            throw SQLiteError(code: code, message: connection.lastErrorMessage, sql: sql)
        }
        self.pointer = statement
        self.connection = connection
        self.sql = sql
    }

    deinit { sqlite3_finalize(pointer) }

    /// Resets the statement and clears its bindings (`sqlite3_reset`, `sqlite3_clear_bindings`).
    public func reset() {
        sqlite3_reset(pointer)
        sqlite3_clear_bindings(pointer)
    }

    /// Binds positional arguments (`sqlite3_bind_*`), each value binding itself in one pass. Text
    /// and blobs are copied into memory the statement keeps and bound without a copy of SQLite's
    /// own (`SQLITE_STATIC`): SQLite reads them while the statement runs, and that memory is only
    /// reused by the next `bind`, after the reset that clears these bindings. Having SQLite
    /// allocate, copy and free every text (`SQLITE_TRANSIENT`) cost 10,000 instructions a task;
    /// turning every argument into an `SQLValue` in an array first, 5,000 more.
    func bind(_ arguments: [any SQLBindable]) throws(SQLiteError) {
        bound.rewind()
        for position in arguments.indices {
            let code = arguments[position].bind(to: self, at: Int32(position + 1))
            guard code == SQLITE_OK else {
                throw SQLiteError(code: code, message: connection.lastErrorMessage, sql: sql)
            }
        }
    }

    func bindNull(at index: Int32) -> Int32 { sqlite3_bind_null(pointer, index) }
    func bind(_ number: Int64, at index: Int32) -> Int32 { sqlite3_bind_int64(pointer, index, number) }
    func bind(_ number: Double, at index: Int32) -> Int32 { sqlite3_bind_double(pointer, index, number) }

    func bind(_ text: String, at index: Int32) -> Int32 {
        let bind = { (bytes: UnsafeBufferPointer<UInt8>) in
            sqlite3_bind_text(self.pointer, index, self.bound.keep(UnsafeRawBufferPointer(bytes)), Int32(bytes.count), nil)
        }
        return text.utf8.withContiguousStorageIfAvailable(bind) ?? Array(text.utf8).withUnsafeBufferPointer(bind)
    }

    func bind(_ value: SQLValue, at index: Int32) -> Int32 {
        switch value {
        case .null: return bindNull(at: index)
        case .integer(let number): return bind(number, at: index)
        case .real(let number): return bind(number, at: index)
        case .text(let text): return bind(text, at: index)
        case .blob(let bytes):
            return bytes.withUnsafeBytes { sqlite3_bind_blob(pointer, index, bound.keep($0), Int32($0.count), nil) }
        }
    }

    /// Advances one row (`sqlite3_step`): true when a row is available.
    public func step() throws(SQLiteError) -> Bool {
        let code = sqlite3_step(pointer)
        switch code {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default:
            let error = SQLiteError(code: code, message: connection.lastErrorMessage, sql: sql)
            sqlite3_reset(pointer)
            throw error
        }
    }

    var raw: OpaquePointer { pointer }
}

/// Memory a statement's bound text and blobs live in until it is bound again. What does not fit
/// goes to a block of its own, and the next round starts with room for all of it.
/// Only its own methods touch its properties, one call at a time: no runtime exclusivity checks.
private final class ArgumentBuffer {
    @exclusivity(unchecked) private var bytes: UnsafeMutableRawPointer
    @exclusivity(unchecked) private var capacity = 1024
    @exclusivity(unchecked) private var used = 0
    @exclusivity(unchecked) private var overflow: [UnsafeMutableRawPointer] = []
    @exclusivity(unchecked) private var overflowBytes = 0

    init() { bytes = .allocate(byteCount: capacity, alignment: 8) }

    deinit {
        bytes.deallocate()
        for block in overflow { block.deallocate() }
    }

    /// Forgets what was kept (its bindings were cleared), growing to hold a round like the last.
    func rewind() {
        used = 0
        guard !overflow.isEmpty else { return }
        for block in overflow { block.deallocate() }
        overflow.removeAll(keepingCapacity: true)
        bytes.deallocate()
        capacity = max(capacity * 2, capacity + overflowBytes)
        bytes = .allocate(byteCount: capacity, alignment: 8)
        overflowBytes = 0
    }

    /// A copy of `source` that lives until the next `rewind`; never a null pointer (SQLite binds
    /// text at a null pointer as NULL, and '' is not NULL).
    func keep(_ source: UnsafeRawBufferPointer) -> UnsafePointer<CChar> {
        guard let base = source.baseAddress, source.count > 0 else {
            return UnsafePointer(bytes.assumingMemoryBound(to: CChar.self))
        }
        let target: UnsafeMutableRawPointer
        if used + source.count <= capacity {
            target = bytes + used
            used += source.count
        } else {
            target = .allocate(byteCount: source.count, alignment: 8)
            overflow.append(target)
            overflowBytes += source.count
        }
        target.copyMemory(from: base, byteCount: source.count)
        return UnsafePointer(target.assumingMemoryBound(to: CChar.self))
    }
}

/// The current row of a statement; valid only inside the mapping closure.
public struct Row {
    let statement: Statement

    public func isNull(_ column: Int32) -> Bool { sqlite3_column_type(statement.raw, column) == SQLITE_NULL }
    public func int(_ column: Int32) -> Int64 { sqlite3_column_int64(statement.raw, column) }
    public func optionalInt(_ column: Int32) -> Int64? { isNull(column) ? nil : int(column) }
    public func double(_ column: Int32) -> Double { sqlite3_column_double(statement.raw, column) }
    public func optionalDouble(_ column: Int32) -> Double? { isNull(column) ? nil : double(column) }
    public func string(_ column: Int32) -> String {
        guard let text = sqlite3_column_text(statement.raw, column) else { return "" }
        let count = Int(sqlite3_column_bytes(statement.raw, column))
        return String(decoding: UnsafeRawBufferPointer(start: text, count: count), as: UTF8.self)
    }
    public func optionalString(_ column: Int32) -> String? { isNull(column) ? nil : string(column) }
}
