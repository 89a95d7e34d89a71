/// A failure of libpq or of the server: the server's SQLSTATE where it sent one, and its message.
public struct PostgresError: Error, Sendable, CustomStringConvertible {
    /// Where it went wrong: reaching the server (the connection is unusable until it is reset),
    /// or a statement the server refused (the connection is still good).
    public enum Kind: Sendable, Equatable {
        case connection
        case statement
    }

    public var kind: Kind
    /// The five-character SQLSTATE (`23505` a unique violation, `08006` a connection failure…),
    /// nil when the failure was the client's own (no server answer).
    public var sqlState: String?
    public var message: String
    /// The statement that failed, when there was one.
    public var sql: String?

    public init(kind: Kind, sqlState: String? = nil, message: String, sql: String? = nil) {
        self.kind = kind
        self.sqlState = sqlState
        self.message = message
        self.sql = sql
    }

    /// A row with the same key exists (`unique_violation`).
    public var isUniqueViolation: Bool { sqlState == "23505" }
    /// The server gave up on the transaction to keep it serializable, or found a deadlock: it may
    /// be run again (`40001`, `40P01`).
    public var isRetryable: Bool { sqlState == "40001" || sqlState == "40P01" }
    /// The server is out of reach or went away: the connection failed, or the SQLSTATE is of class
    /// 08 (connection exception) or 57P0x (the server shutting down).
    public var isConnectionLost: Bool {
        kind == .connection || sqlState?.hasPrefix("08") == true || sqlState?.hasPrefix("57P0") == true
    }
    /// The statement ran out of its time: `statement_timeout` or `lock_timeout` (`57014`
    /// query_canceled, `55P03` lock_not_available), as when it waits on a lock that a stalled
    /// session holds.
    public var isTimeout: Bool { sqlState == "57014" || sqlState == "55P03" }
    /// The server refused the credentials (`28000` invalid authorization, `28P01` invalid password).
    public var isAuthenticationFailure: Bool { sqlState?.hasPrefix("28") == true }

    public var description: String {
        "PostgreSQL error" + (sqlState.map { " \($0)" } ?? "") + ": \(message)" + (sql.map { " (in \($0))" } ?? "")
    }
}
