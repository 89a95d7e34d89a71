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

    /// Binds positional arguments (`sqlite3_bind_*`). Text and blobs are copied into a buffer the
    /// statement keeps and bound without a copy of SQLite's own (`SQLITE_STATIC`): SQLite read
    /// them while the statement ran, and the buffer is only written again by the next `bind`, after
    /// the reset that clears these bindings. Having SQLite allocate, copy and free every text
    /// (`SQLITE_TRANSIENT`) cost 10,000 instructions a task.
    public func bind(_ arguments: [any SQLBindable]) throws(SQLiteError) {
        var values: [SQLValue] = []
        values.reserveCapacity(arguments.count)
        var length = 0
        for argument in arguments {
            let value = argument.sqlValue
            switch value {
            case .text(let text): length += text.utf8.count
            case .blob(let bytes): length += bytes.count
            case .null, .integer, .real: break
            }
            values.append(value)
        }
        bound.reserve(length)
        var offset = 0
        for (position, value) in values.enumerated() {
            let index = Int32(position + 1)
            let code: Int32
            switch value {
            case .null: code = sqlite3_bind_null(pointer, index)
            case .integer(let number): code = sqlite3_bind_int64(pointer, index, number)
            case .real(let number): code = sqlite3_bind_double(pointer, index, number)
            case .text(var text):
                let start = bound.bytes + offset
                offset += text.withUTF8 { bound.copy($0, to: start) }
                code = sqlite3_bind_text(pointer, index, start.assumingMemoryBound(to: CChar.self), Int32(text.utf8.count), nil)
            case .blob(let bytes):
                let start = bound.bytes + offset
                offset += bytes.withUnsafeBufferPointer { bound.copy($0, to: start) }
                code = sqlite3_bind_blob(pointer, index, start, Int32(bytes.count), nil)
            }
            guard code == SQLITE_OK else {
                throw SQLiteError(code: code, message: connection.lastErrorMessage, sql: sql)
            }
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

/// Memory a statement's bound text and blobs live in until it is bound again; grown, never shrunk.
private final class ArgumentBuffer {
    private(set) var bytes: UnsafeMutableRawPointer
    private var capacity = 256

    init() { bytes = .allocate(byteCount: capacity, alignment: 8) }

    deinit { bytes.deallocate() }

    /// Room for `length` bytes; what was bound before is gone.
    func reserve(_ length: Int) {
        guard length > capacity else { return }
        bytes.deallocate()
        capacity = max(length, capacity * 2)
        bytes = .allocate(byteCount: capacity, alignment: 8)
    }

    /// Copies `source` to `start` (within the reserved room); returns its length.
    func copy(_ source: UnsafeBufferPointer<UInt8>, to start: UnsafeMutableRawPointer) -> Int {
        if let base = source.baseAddress { start.copyMemory(from: base, byteCount: source.count) }
        return source.count
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
