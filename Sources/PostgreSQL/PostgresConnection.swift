internal import CLibPQ
import Glibc

/// A value sent as a statement's parameter. Text goes as text, bytes in binary, numbers and
/// booleans in their text form, which the server casts to the column's type.
public enum PostgresValue: Sendable, Equatable {
    case null
    case text(String)
    case int(Int64)
    case double(Double)
    case bool(Bool)
    case bytes([UInt8])
}

/// One connection to a PostgreSQL server (`PQconnectdb`), owned by one thread at a time: libpq's
/// calls on it block that thread until the server answers. Statements are sent with their
/// parameters apart from the SQL (`PQexecParams`), so a value is never spliced into it.
///
/// A connection that broke stays broken until `reset()`: every call fails with a `.connection`
/// error, and the caller decides when to try again.
public final class PostgresConnection {
    /// libpq's connection (the module's extensions use it; nothing outside the module does).
    let raw: OpaquePointer
    /// Statements prepared on this connection's session, by their text: one run again is sent by
    /// name (`PQexecPrepared`), parsed and planned by the server once. At most `preparedLimit`;
    /// statements beyond (texts made for one batch's size) are sent whole each time.
    private var prepared: [String: String] = [:]
    public static let preparedLimit = 256
    /// With a `deadline`, how long a call waits for the server (seconds) before it gives the
    /// connection up; nil: as long as the server takes.
    private let callTimeout: Double?
    /// Set when a call gave up waiting: the connection's state is unknown, so it counts as lost.
    private var gaveUp = false

    /// Connects with a libpq connection string, a URL (`postgres://user:password@host:port/db?…`)
    /// or `key=value` pairs. `connectTimeout` bounds each attempt to reach the server (seconds);
    /// TCP keepalives notice a server that went away without closing the connection.
    ///
    /// `deadline` (seconds) bounds every call on a dead link or a server that stopped answering:
    /// the kernel gives the connection up when sent bytes stay unacknowledged that long
    /// (`tcp_user_timeout`), the server cancels a statement that runs longer
    /// (`statement_timeout`), and the call itself waits at most that long for the answer (a
    /// server whose process is stopped still acknowledges bytes, and cancels nothing).
    ///
    /// `name` is the session's `application_name`, which `pg_stat_activity` shows: what the
    /// connection is for, to an operator (a URL that names one wins).
    public init(
        _ conninfo: String, connectTimeout: Int = 10, deadline: Double? = nil, name: String = "backhauld"
    ) throws(PostgresError) {
        var keywords = [
            "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
            "application_name",
        ]
        var values = [String(connectTimeout), "1", "10", "5", "3", name]
        if let deadline {
            let milliseconds = String(max(1, Int(deadline * 1000)))
            keywords += ["tcp_user_timeout", "options"]
            values += [milliseconds, "-c statement_timeout=" + milliseconds]
        }
        keywords.append("dbname")
        values.append(conninfo)
        callTimeout = deadline
        // `expand_dbname`: the last value is itself a connection string or URL, expanded in its
        // place; a setting named twice takes its last value, so what the URL names wins over
        // these defaults.
        let connection = Self.withCStrings(keywords) { keywordPointers in
            Self.withCStrings(values) { valuePointers in PQconnectdbParams(keywordPointers, valuePointers, 1) }
        }
        guard let connection else {
            throw PostgresError(kind: .connection, message: "libpq could not allocate a connection")
        }
        raw = connection
        guard PQstatus(raw) == CONNECTION_OK else {
            // `deinit` finishes the handle: every stored property is set, so it runs.
            let message = Self.trimmed(PQerrorMessage(raw))
            // A refused login has no SQLSTATE on the client's side; the server's message names it.
            let refused = message.contains("authentication failed") || message.contains("no password supplied")
            throw PostgresError(kind: .connection, sqlState: refused ? "28P01" : nil, message: message)
        }
        // Notices (`… already exists, skipping`) are the server's remarks, not errors: libpq
        // would print each to stderr.
        PQsetNoticeProcessor(raw, { _, _ in }, nil)
    }

    deinit { PQfinish(raw) }

    /// Whether the connection is up, as libpq last saw it.
    public var isConnected: Bool { !gaveUp && PQstatus(raw) == CONNECTION_OK }

    /// The server process of this session (`PQbackendPID`).
    public var backendPID: Int32 { PQbackendPID(raw) }

    /// Throws once a call gave the connection up: its session may still be alive behind the
    /// socket, with statements of the call given up unanswered (a pipeline's still queued), so no
    /// statement may follow them on it.
    private func checkUsable(_ sql: String) throws(PostgresError) {
        guard !gaveUp else {
            throw PostgresError(kind: .connection, message: "the connection was given up after a call went unanswered", sql: sql)
        }
    }

    /// When a call begun now must have its answer (`callTimeout` from now), or nil without a bound.
    private func callDeadline() -> Double? { callTimeout.map { monotonicNow() + $0 } }

    private func monotonicNow() -> Double {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }

    /// The server's version as a number (150004 for 15.4).
    public var serverVersion: Int { Int(PQserverVersion(raw)) }

    /// Connects again with the same settings (`PQreset`); throws when the server is still out of
    /// reach.
    public func reset() throws(PostgresError) {
        // A new session: the old one's prepared statements went with it.
        prepared = [:]
        gaveUp = false
        PQreset(raw)
        guard PQstatus(raw) == CONNECTION_OK else {
            throw PostgresError(kind: .connection, message: Self.trimmed(PQerrorMessage(raw)))
        }
    }

    /// Runs one statement with `$1…$n` bound to `parameters` and returns its rows (none for a
    /// statement that returns none).
    @discardableResult
    public func execute(_ sql: String, _ parameters: [PostgresValue] = []) throws(PostgresError) -> PostgresRows {
        try checkUsable(sql)
        let deadline = callDeadline()
        if let name = try preparedName(sql, parameters: parameters.count, deadline: deadline) {
            if let deadline {
                let sent = Self.sent(parameters) { values, lengths, formats in
                    PQsendQueryPrepared(raw, name, Int32(parameters.count), values, lengths, formats, 0)
                }
                return try rows(of: answer(sent, sql: sql, deadline: deadline), sql: sql)
            }
            let result = Self.sent(parameters) { values, lengths, formats in
                PQexecPrepared(raw, name, Int32(parameters.count), values, lengths, formats, 0)
            }
            return try rows(of: result, sql: sql)
        }
        if let deadline {
            let sent = Self.sent(parameters) { values, lengths, formats in
                PQsendQueryParams(raw, sql, Int32(parameters.count), nil, values, lengths, formats, 0)
            }
            return try rows(of: answer(sent, sql: sql, deadline: deadline), sql: sql)
        }
        let result = Self.sent(parameters) { values, lengths, formats in
            PQexecParams(raw, sql, Int32(parameters.count), nil, values, lengths, formats, 0)
        }
        return try rows(of: result, sql: sql)
    }

    /// The result of the statement just sent (`sent`: what `PQsend…` returned), the results after
    /// it discarded, all in by `deadline`.
    private func answer(_ sent: Int32, sql: String, deadline: Double) throws(PostgresError) -> OpaquePointer? {
        guard sent == 1 else {
            throw PostgresError(kind: .connection, message: Self.trimmed(PQerrorMessage(raw)), sql: sql)
        }
        try awaitResult(sql: sql, deadline: deadline)
        let result = PQgetResult(raw)
        while true {
            try awaitResult(sql: sql, deadline: deadline)
            guard let extra = PQgetResult(raw) else { break }
            PQclear(extra)
        }
        return result
    }

    /// Sends what is queued and reads until the next result is in, so that `PQgetResult` will not
    /// block, waiting for the server (poll on the socket) until `deadline` (nil: nothing, and
    /// `PQgetResult` waits); past it the connection is given up and the call fails as a lost
    /// connection. One deadline for a whole call: a pipeline's answers together wait at most
    /// `callTimeout`.
    private func awaitResult(sql: String, deadline: Double?) throws(PostgresError) {
        guard let deadline, let timeout = callTimeout else { return }
        while true {
            let flushed = PQflush(raw)
            guard flushed >= 0 else { break }
            let flushing = flushed == 1
            // A result already read (a pipeline's next one, often) is not waited for.
            if !flushing, PQisBusy(raw) == 0 { break }
            let left = deadline - monotonicNow()
            var descriptor = pollfd(fd: PQsocket(raw), events: Int16(POLLIN | (flushing ? POLLOUT : 0)), revents: 0)
            guard left > 0, descriptor.fd >= 0, poll(&descriptor, 1, Int32(left * 1000) + 1) > 0 else {
                gaveUp = true
                throw PostgresError(
                    kind: .connection, message: "the server did not answer within \(timeout) s; the connection is given up",
                    sql: sql)
            }
            guard descriptor.revents & Int16(POLLIN) == 0 || PQconsumeInput(raw) == 1 else { break }
        }
    }

    /// Runs `statements` in one round trip (libpq's pipeline mode): each is sent with its parameters,
    /// then the server answers them all. Their rows, in order; the first refused statement's error
    /// is thrown once every answer is read (the ones after it were not run). For statements that
    /// do not need each other's answers: a transaction's last steps and its COMMIT.
    public func pipeline(_ statements: [(sql: String, parameters: [PostgresValue])]) throws(PostgresError) -> [PostgresRows] {
        // Statements with parameters are prepared on the session the first time (one round trip
        // each, once), outside the pipeline; then they go by name.
        try checkUsable(statements.first?.sql ?? "")
        let deadline = callDeadline()
        for (sql, parameters) in statements where !parameters.isEmpty {
            _ = try preparedName(sql, parameters: parameters.count, deadline: deadline)
        }
        guard PQenterPipelineMode(raw) == 1 else {
            throw PostgresError(kind: .connection, message: Self.trimmed(PQerrorMessage(raw)))
        }
        defer { PQexitPipelineMode(raw) }
        for (sql, parameters) in statements {
            // A statement prepared on this session already goes by its name.
            let name = prepared[sql]
            let queued = Self.sent(parameters) { values, lengths, formats in
                name.map { PQsendQueryPrepared(raw, $0, Int32(parameters.count), values, lengths, formats, 0) }
                    ?? PQsendQueryParams(raw, sql, Int32(parameters.count), nil, values, lengths, formats, 0)
            }
            guard queued == 1 else {
                throw PostgresError(kind: .connection, message: Self.trimmed(PQerrorMessage(raw)), sql: sql)
            }
        }
        guard PQpipelineSync(raw) == 1 else {
            throw PostgresError(kind: .connection, message: Self.trimmed(PQerrorMessage(raw)))
        }
        var answers: [PostgresRows] = []
        var failure: PostgresError?
        for (sql, _) in statements {
            // Each statement's result, then a null that ends it.
            try awaitResult(sql: sql, deadline: deadline)
            guard let result = PQgetResult(raw) else {
                throw PostgresError(kind: .connection, message: Self.trimmed(PQerrorMessage(raw)), sql: sql)
            }
            if PQresultStatus(result) == PGRES_PIPELINE_ABORTED {
                PQclear(result)
            } else {
                do { answers.append(try rows(of: result, sql: sql)) } catch { failure = failure ?? error }
            }
            while let extra = PQgetResult(raw) { PQclear(extra) }
        }
        // The sync's own result.
        try awaitResult(sql: "SYNC", deadline: deadline)
        if let sync = PQgetResult(raw) { PQclear(sync) }
        if let failure { throw failure }
        return answers
    }

    /// The name `sql` is prepared under on this session, preparing it the first time (the
    /// server infers the parameters' types, as it does for a statement sent whole); nil for a
    /// statement without parameters, or once the cache is full.
    private func preparedName(_ sql: String, parameters: Int, deadline: Double?) throws(PostgresError) -> String? {
        if let name = prepared[sql] { return name }
        guard parameters > 0, prepared.count < Self.preparedLimit else { return nil }
        let name = "backhaul_\(prepared.count)"
        if let deadline {
            let sent = PQsendPrepare(raw, name, sql, Int32(parameters), nil)
            _ = try rows(of: answer(sent, sql: sql, deadline: deadline), sql: sql)
        } else {
            _ = try rows(of: PQprepare(raw, name, sql, Int32(parameters), nil), sql: sql)
        }
        prepared[sql] = name
        return name
    }

    /// Runs statements with no parameters, separated by semicolons (a schema, a migration): one
    /// round trip, one implicit transaction unless the text has its own `BEGIN`/`COMMIT`.
    public func executeScript(_ sql: String) throws(PostgresError) {
        try checkUsable(sql)
        _ = try rows(of: PQexec(raw, sql), sql: sql)
    }

    /// Runs `body` in a transaction: committed when it returns, rolled back when it throws.
    public func transaction<T>(_ body: () throws -> T) throws -> T {
        try execute("BEGIN")
        do {
            let value = try body()
            try execute("COMMIT")
            return value
        } catch {
            // A broken connection has no transaction left to roll back.
            if isConnected { _ = try? execute("ROLLBACK") }
            throw error
        }
    }

    // MARK: Results

    private func rows(of result: OpaquePointer?, sql: String) throws(PostgresError) -> PostgresRows {
        guard let result else {
            // No result at all: out of memory, or the connection is gone.
            throw PostgresError(kind: .connection, message: Self.trimmed(PQerrorMessage(raw)), sql: sql)
        }
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY:
            return PostgresRows(result)
        default:
            let state = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
            let message = Self.trimmed(PQresultErrorMessage(result))
            PQclear(result)
            let broken = PQstatus(raw) != CONNECTION_OK
            throw PostgresError(kind: broken ? .connection : .statement, sqlState: state, message: message, sql: sql)
        }
    }

    // MARK: C strings

    /// Calls `body` with the parameters as libpq takes them: values (nil for NULL), lengths and
    /// formats (1, binary, for bytes; 0, text, for the rest). The values are laid end to end in
    /// one buffer, pinned once, and each pointer is an offset into it.
    private static func sent<Answer>(
        _ parameters: [PostgresValue],
        _ body: (UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?, UnsafePointer<Int32>?) -> Answer
    ) -> Answer {
        var storage: [UInt8] = []
        var offsets: [Int?] = []
        var lengths: [Int32] = []
        var formats: [Int32] = []
        for parameter in parameters {
            let start = storage.count
            switch parameter {
            case .null: break
            case .text(let text): storage += text.utf8
            case .int(let value): storage += String(value).utf8
            case .double(let value): storage += String(value).utf8
            case .bool(let value): storage += (value ? "t" : "f").utf8
            case .bytes(let bytes): storage += bytes
            }
            lengths.append(Int32(storage.count - start))
            if case .bytes = parameter { formats.append(1) } else { formats.append(0) }
            if case .null = parameter {
                offsets.append(nil)
            } else {
                offsets.append(start)
                storage.append(0)  // text values end with NUL; a binary value's length says where it ends
            }
        }
        return storage.withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { chars in
                let values: [UnsafePointer<CChar>?] = offsets.map { offset in
                    offset.flatMap { chars.baseAddress?.advanced(by: $0) }
                }
                return lengths.withUnsafeBufferPointer { lengthPointer in
                    formats.withUnsafeBufferPointer { formatPointer in
                        values.withUnsafeBufferPointer { valuePointer in
                            body(valuePointer.baseAddress, lengthPointer.baseAddress, formatPointer.baseAddress)
                        }
                    }
                }
            }
        }
    }

    private static func withCStrings<T>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>?) -> T) -> T {
        let copies = strings.map { strdup($0) }
        defer { for copy in copies { free(copy) } }
        let pointers = copies.map { UnsafePointer($0) } + [nil]
        return pointers.withUnsafeBufferPointer { body($0.baseAddress) }
    }

    static func trimmed(_ message: UnsafePointer<CChar>?) -> String {
        guard let message else { return "" }
        var text = String(cString: message)
        while text.last?.isWhitespace == true { text.removeLast() }
        return text
    }
}
