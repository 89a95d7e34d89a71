import CSQLite

extension Row {
    /// The number of columns of the row (`sqlite3_column_count`).
    public var columnCount: Int32 { sqlite3_column_count(statement.raw) }

    /// Column `column` as whatever type SQLite holds it in (`sqlite3_column_type`, then the
    /// matching `sqlite3_column_*`): for copying rows without knowing their schema.
    public func value(_ column: Int32) -> SQLValue {
        switch sqlite3_column_type(statement.raw, column) {
        case SQLITE_INTEGER: return .integer(int(column))
        case SQLITE_FLOAT: return .real(double(column))
        case SQLITE_TEXT: return .text(string(column))
        case SQLITE_BLOB:
            let count = Int(sqlite3_column_bytes(statement.raw, column))
            guard let bytes = sqlite3_column_blob(statement.raw, column), count > 0 else { return .blob([]) }
            return .blob(Array(UnsafeRawBufferPointer(start: bytes, count: count)))
        default: return .null
        }
    }
}

extension SQLiteError {
    /// SQLite found the file damaged (`SQLITE_CORRUPT`, `SQLITE_NOTADB`), rather than unreachable,
    /// busy or full.
    public var isDamage: Bool { primaryCode == SQLITE_CORRUPT || primaryCode == SQLITE_NOTADB }
}
