import BackhaulCore
import BackhaulQueue
import Glibc
import PostgreSQL
import Threads

/// One write transaction (or a read connection) as the store's code sees it: statements, and what
/// the transaction changed for the observers, kept apart per job so that a job rolled back to its
/// savepoint takes its changes back.
public final class PostgresTransaction {
    let connection: PostgresConnection
    /// This node's id.
    let node: String
    var changes = StoreChanges()
    /// The node each queued entry of `changes.queued` is pinned to (nil: any node).
    var pins: [Int64: String] = [:]
    /// Events to append at the end of the transaction, under the events' lock (`PostgresWriter`).
    var events: [PendingEvent] = []
    /// Files to remove once the transaction's commit is durable (`FileRemovals`).
    var files = FileRemovals()
    /// How the transaction changed each session's unfinished tasks: added to `sessions.open_tasks`
    /// at its end (`PostgresWriter`), so that counting them reads one row.
    var openDeltas: [String: Int] = [:]
    /// Sessions this transaction locked, as read then (their committed count of unfinished tasks):
    /// a second admission to one in the same transaction needs no second read.
    var lockedSessions: [String: (session: SessionRecord, open: Int)] = [:]
    /// Leases this node took (a start) and gave up (an end), applied to `PostgresStore.leased`.
    var leasesTaken: [String] = []
    var leasesEnded: [String] = []

    init(_ connection: PostgresConnection, node: String) {
        self.connection = connection
        self.node = node
    }

    /// An event of the transaction, not yet written.
    struct PendingEvent {
        var type: String
        var sessionID: String
        var taskID: String?
        var data: String
        var createdAt: Timestamp
    }

    /// Statements not sent yet, to go in front of the next one in one round trip: the ones that
    /// open the transaction (`begin`), and writes whose answer no one reads (`send`).
    private(set) var unsent: [(sql: String, parameters: [PostgresValue])] = []
    /// How many statements were sent from `unsent` so far (for a job's `Mark`).
    private var sentCount = 0

    /// Opens the transaction with `statements` (`BEGIN`, a `SET LOCAL`), sent with the first
    /// statement run in it.
    func begin(_ statements: [(sql: String, parameters: [PostgresValue])]) { unsent = statements }

    /// A write whose answer no one reads, sent with the transaction's next statement, at the
    /// latest with its `COMMIT`; its error, if any, is that statement's.
    func send(_ sql: String, _ parameters: [PostgresValue]) { unsent.append((sql, parameters)) }

    /// Sends the statements not sent yet, then `statements`, in one round trip; their answers.
    func flush(_ statements: [(sql: String, parameters: [PostgresValue])]) throws(PostgresError) -> [PostgresRows] {
        let sending = unsent + statements
        sentCount += unsent.count
        unsent = []
        return try connection.pipeline(sending)
    }

    /// Rolls the whole transaction back, and ends it: what was not sent is dropped (nothing at
    /// all sent, not even its `BEGIN`: there is nothing to roll back).
    func rollBackAll() throws(PostgresError) {
        unsent = []
        if sentCount > 0 { try connection.execute("ROLLBACK") }
    }

    @discardableResult
    func execute(_ sql: String, _ parameters: [PostgresValue] = []) throws(PostgresError) -> PostgresRows {
        guard unsent.isEmpty else {
            let answers = try flush([(sql, parameters)])
            return answers[answers.count - 1]
        }
        return try connection.execute(sql, parameters)
    }

    func rows<T>(_ sql: String, _ parameters: [PostgresValue] = [], _ map: (PostgresRow) throws -> T) throws -> [T] {
        let rows = try execute(sql, parameters)
        return try (0..<rows.count).map { try map(PostgresRow(rows: rows, index: $0)) }
    }

    func first<T>(_ sql: String, _ parameters: [PostgresValue] = [], _ map: (PostgresRow) throws -> T) throws -> T? {
        let rows = try execute(sql, parameters)
        return rows.count == 0 ? nil : try map(PostgresRow(rows: rows, index: 0))
    }

    /// A task of `session` entered (+1) or left (-1) the unfinished ones.
    func countOpen(_ session: String, _ delta: Int) {
        guard !session.isEmpty else { return }
        openDeltas[session, default: 0] += delta
    }

    // MARK: A job's part of the transaction

    struct Mark {
        fileprivate var changes: StoreChanges
        fileprivate var pins: [Int64: String]
        fileprivate var openDeltas: [String: Int]
        fileprivate var lockedSessions: [String: (session: SessionRecord, open: Int)]
        fileprivate var events: Int
        fileprivate var files: Int
        fileprivate var taken: Int
        fileprivate var ended: Int
        /// How many statements had been handed to `unsent` (sent or not).
        fileprivate var handed: Int
    }

    var mark: Mark {
        Mark(
            changes: changes, pins: pins, openDeltas: openDeltas, lockedSessions: lockedSessions, events: events.count,
            files: files.count,
            taken: leasesTaken.count,
            ended: leasesEnded.count, handed: sentCount + unsent.count)
    }

    func rollBack(to mark: Mark) {
        changes = mark.changes
        pins = mark.pins
        openDeltas = mark.openDeltas
        lockedSessions = mark.lockedSessions
        events.removeSubrange(mark.events...)
        files.rollBack(to: mark.files)
        leasesTaken.removeSubrange(mark.taken...)
        leasesEnded.removeSubrange(mark.ended...)
        // The job's writes not sent yet are dropped; the ones sent are undone by its savepoint.
        unsent.removeSubrange(min(max(mark.handed - sentCount, 0), unsent.count)...)
    }
}

/// One row of a result, read by column as `TaskRows.decode` reads SQLite's. PostgreSQL sends
/// every value as text; a NULL reads as 0 or "" where the type has no nil.
struct PostgresRow: StoredRow {
    let rows: PostgresRows
    let index: Int

    func isNull(_ column: Int32) -> Bool { rows.isNull(index, Int(column)) }
    func int(_ column: Int32) -> Int64 { rows.int(index, Int(column)) ?? 0 }
    func optionalInt(_ column: Int32) -> Int64? { rows.int(index, Int(column)) }
    func double(_ column: Int32) -> Double { rows.double(index, Int(column)) ?? 0 }
    func optionalDouble(_ column: Int32) -> Double? { rows.double(index, Int(column)) }
    func string(_ column: Int32) -> String { rows.string(index, Int(column)) ?? "" }
    func optionalString(_ column: Int32) -> String? { rows.string(index, Int(column)) }
}

extension PostgresValue {
    /// The value of an optional: NULL when nil.
    static func text(_ value: String?) -> PostgresValue { value.map { .text($0) } ?? .null }
    static func int(_ value: Int64?) -> PostgresValue { value.map { .int($0) } ?? .null }
    static func int(_ value: Int) -> PostgresValue { .int(Int64(value)) }
    static func int(_ value: Int?) -> PostgresValue { value.map { .int(Int64($0)) } ?? .null }
    static func double(_ value: Double?) -> PostgresValue { value.map { .double($0) } ?? .null }
    /// Sequences as a PostgreSQL array literal (for `$n::bigint[]`).
    static func array(_ sequences: some Sequence<Int64>) -> PostgresValue {
        .text("{" + sequences.map(String.init).joined(separator: ",") + "}")
    }

    /// Strings as a PostgreSQL array literal (for `$n::text[]`), each quoted.
    static func array(_ texts: some Sequence<String>) -> PostgresValue {
        .text(
            "{"
                + texts.map { "\"" + $0.replacing("\\", with: "\\\\").replacing("\"", with: "\\\"") + "\"" }.joined(
                    separator: ",") + "}")
    }

    /// A flag as the SQLite schema keeps it: 0 or 1.
    static func flag(_ value: Bool) -> PostgresValue { .int(value ? 1 : 0) }
}

/// Connections for reads, each used by one thread at a time. A connection that broke, or gave up
/// waiting for the server after `deadline` seconds (a read is never left in doubt), is made anew
/// on its next use.
final class ConnectionPool: @unchecked Sendable {
    private let url: String
    private let idle: Locked<(connections: [PostgresConnection], closed: Bool)>

    init(url: String, count: Int, deadline: Double) throws(PostgresError) {
        self.url = url
        var connections: [PostgresConnection] = []
        for _ in 0..<count { connections.append(try PostgresConnection(url, deadline: deadline)) }
        idle = Locked((connections, false))
    }

    func use<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        let connection = idle.wait(until: { !$0.connections.isEmpty || $0.closed }, timeout: 1e9) { $0.connections.popLast() }
        guard let connection else { throw StoreError.database("the store is closed") }
        defer { idle.withLockNotifyingAll { $0.connections.append(connection) } }
        if !connection.isConnected { try connection.reset() }
        return try body(connection)
    }

    func close() { idle.withLockNotifyingAll { $0.closed = true } }
}
