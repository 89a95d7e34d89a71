import BackhaulTesting
import Foundation
import PostgreSQL
import Testing

/// The libpq wrapper against a real PostgreSQL started for these tests (initdb, pg_ctl).
@Suite("PostgreSQL (libpq)", .serialized)
final class PostgreSQLTests {
    let server: PostgresServer

    init() throws { server = try PostgresServer() }

    @Test("values go as parameters and come back unchanged, NULL included")
    func roundTrip() throws {
        let db = try PostgresConnection(server.url)
        #expect(db.serverVersion >= 150_000)
        try db.execute("CREATE TABLE t (s text, i bigint, d double precision, b boolean, y bytea)")
        let text = "it's \"quoted\"; -- not a comment, ünïcödé, \\ and $1"
        let bytes: [UInt8] = [0, 1, 2, 0xFF, 0, 39, 92]
        let inserted = try db.execute(
            "INSERT INTO t VALUES ($1, $2, $3, $4, $5), ($6, $7, $8, $9, $10)",
            [
                .text(text), .int(Int64.min), .double(0.1), .bool(true), .bytes(bytes),
                .null, .null, .null, .null, .null,
            ])
        #expect(inserted.affected == 2)
        let rows = try db.execute("SELECT s, i, d, b, y FROM t ORDER BY s NULLS LAST")
        #expect(rows.count == 2 && rows.columnCount == 5)
        #expect(rows.string(0, 0) == text && rows.int(0, 1) == Int64.min && rows.double(0, 2) == 0.1)
        #expect(rows.bool(0, 3) == true && rows.bytes(0, 4) == bytes)
        #expect((0..<5).allSatisfy { rows.isNull(1, $0) } && rows.string(1, 0) == nil)
        // Out of range reads as NULL, never a crash.
        #expect(rows.string(7, 0) == nil && rows.string(0, 9) == nil)
    }

    @Test("a statement with parameters is prepared once and run again by name; past the cache's size it is sent whole")
    func preparedStatements() throws {
        let db = try PostgresConnection(server.url)
        for value in 1...3 { #expect(try db.execute("SELECT $1::int + 1", [.int(Int64(value))]).int(0, 0) == Int64(value + 1)) }
        let prepared = try db.execute("SELECT statement FROM pg_prepared_statements")
        let texts = (0..<prepared.count).compactMap { prepared.string($0, 0) }
        #expect(texts == ["SELECT $1::int + 1"], "\(texts)")
        // More distinct texts than the cache holds: every one still runs, and the cache stops growing.
        for value in 0..<(PostgresConnection.preparedLimit + 10) {
            #expect(try db.execute("SELECT $1::int + \(value)", [.int(1)]).int(0, 0) == Int64(value + 1))
        }
        let count = try db.execute("SELECT count(*) FROM pg_prepared_statements").int(0, 0)
        #expect(count == Int64(PostgresConnection.preparedLimit))
    }

    @Test("a pipeline runs its statements in order and answers each; a refused one stops the rest, and the connection goes on")
    func pipeline() throws {
        let db = try PostgresConnection(server.url)
        try db.execute("CREATE TABLE piped (n int PRIMARY KEY)")
        let answers = try db.pipeline([
            ("BEGIN", []), ("INSERT INTO piped VALUES ($1)", [.int(1)]),
            ("INSERT INTO piped VALUES ($1), ($2)", [.int(2), .int(3)]),
            ("SELECT count(*) FROM piped", []), ("COMMIT", []),
        ])
        #expect(answers.map(\.affected) == [0, 1, 2, 1, 0])
        #expect(answers[3].int(0, 0) == 3)
        // The duplicate key is refused; what follows it in the pipeline is not run.
        #expect(throws: PostgresError.self) {
            try db.pipeline([
                ("BEGIN", []), ("INSERT INTO piped VALUES ($1)", [.int(1)]), ("INSERT INTO piped VALUES ($1)", [.int(9)]),
                ("COMMIT", []),
            ])
        }
        try db.execute("ROLLBACK")
        #expect(try db.execute("SELECT count(*) FROM piped").int(0, 0) == 3)
        #expect(try db.execute("SELECT count(*) FROM piped WHERE n = $1", [.int(9)]).int(0, 0) == 0)
    }

    @Test("a refused statement carries its SQLSTATE and leaves the connection usable")
    func refusedStatement() throws {
        let db = try PostgresConnection(server.url)
        try db.execute("CREATE TABLE k (id text PRIMARY KEY)")
        try db.execute("INSERT INTO k VALUES ($1)", [.text("a")])
        let error = try #require(throws: PostgresError.self) { try db.execute("INSERT INTO k VALUES ($1)", [.text("a")]) }
        #expect(error.isUniqueViolation && error.kind == .statement && !error.isConnectionLost, "\(error)")
        let syntax = try #require(throws: PostgresError.self) { try db.execute("SELEC 1") }
        #expect(syntax.sqlState == "42601")
        #expect(try db.execute("SELECT count(*) FROM k").int(0, 0) == 1)
    }

    @Test("a transaction commits when its body returns and rolls back when it throws")
    func transactions() throws {
        struct Refused: Error {}
        let db = try PostgresConnection(server.url)
        try db.execute("CREATE TABLE n (v int)")
        try db.transaction { try db.execute("INSERT INTO n VALUES (1)") }
        #expect(throws: Refused.self) {
            try db.transaction {
                try db.execute("INSERT INTO n VALUES (2)")
                throw Refused()
            }
        }
        #expect(try db.execute("SELECT array_agg(v) FROM n").string(0, 0) == "{1}")
    }

    @Test("two connections claiming with FOR UPDATE SKIP LOCKED never take the same row")
    func skipLocked() throws {
        let first = try PostgresConnection(server.url)
        let second = try PostgresConnection(server.url)
        try first.execute("CREATE TABLE q (id int PRIMARY KEY, owner text)")
        try first.execute("INSERT INTO q SELECT g, NULL FROM generate_series(1, 3) g")
        let claim = "SELECT id FROM q WHERE owner IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
        try first.execute("BEGIN")
        let mine = try #require(try first.execute(claim).int(0, 0))
        try second.execute("BEGIN")
        let theirs = try #require(try second.execute(claim).int(0, 0))
        #expect(mine == 1 && theirs == 2)
        try second.execute("UPDATE q SET owner = 'second' WHERE id = $1", [.int(theirs)])
        try second.execute("COMMIT")
        try first.execute("UPDATE q SET owner = 'first' WHERE id = $1", [.int(mine)])
        try first.execute("COMMIT")
        #expect(try first.execute("SELECT count(*) FROM q WHERE owner IS NOT NULL").int(0, 0) == 2)
    }

    @Test("LISTEN hears a NOTIFY sent on another connection; a wait with none ends on time")
    func listenNotify() throws {
        let listener = try PostgresConnection(server.url)
        let sender = try PostgresConnection(server.url)
        try listener.listen("task changes")
        let started = Date()
        #expect(try listener.notifications(waitingUpTo: 0.2).isEmpty)
        #expect(Date().timeIntervalSince(started) < 2)
        try sender.notify("task changes", payload: "t_1")
        var heard: [PostgresNotification] = []
        _ = try eventually(timeout: 5) {
            heard += try listener.notifications(waitingUpTo: 0.5)
            return !heard.isEmpty
        }
        #expect(heard.map(\.payload) == ["t_1"] && heard.first?.channel == "task changes")
        // A notification inside a transaction is sent only when it commits.
        try sender.transaction {
            try sender.notify("task changes", payload: "t_2")
            #expect(try listener.notifications(waitingUpTo: 0.2).isEmpty)
        }
        var later: [PostgresNotification] = []
        _ = try eventually(timeout: 5) {
            later += try listener.notifications(waitingUpTo: 0.5)
            return !later.isEmpty
        }
        #expect(later.map(\.payload) == ["t_2"])
    }

    @Test("an advisory lock is held by one connection at a time")
    func advisoryLock() throws {
        let first = try PostgresConnection(server.url)
        let second = try PostgresConnection(server.url)
        #expect(try first.execute("SELECT pg_try_advisory_lock(42)").bool(0, 0) == true)
        #expect(try second.execute("SELECT pg_try_advisory_lock(42)").bool(0, 0) == false)
        try first.execute("SELECT pg_advisory_unlock(42)")
        #expect(try second.execute("SELECT pg_try_advisory_lock(42)").bool(0, 0) == true)
    }

    @Test("a wrong password and an unreachable server fail at once, with messages that say so")
    func refusedConnections() throws {
        let wrong = try #require(throws: PostgresError.self) {
            try PostgresConnection("postgres://backhaul:not-it@127.0.0.1:\(server.port)/backhaul")
        }
        #expect(wrong.isAuthenticationFailure && wrong.message.contains("password authentication failed"), "\(wrong)")
        let closed = try freePort()
        let started = Date()
        let unreachable = try #require(throws: PostgresError.self) {
            try PostgresConnection("postgres://backhaul:x@127.0.0.1:\(closed)/backhaul", connectTimeout: 2)
        }
        #expect(unreachable.kind == .connection && !unreachable.isAuthenticationFailure, "\(unreachable)")
        #expect(Date().timeIntervalSince(started) < 5)
    }

    @Test("the server going away breaks the connection at the next call; reset reconnects once it is back")
    func serverRestart() throws {
        let db = try PostgresConnection(server.url)
        try db.execute("CREATE TABLE kept (v int)")
        try db.execute("INSERT INTO kept VALUES (7)")
        try server.stop(immediate: true)
        let lost = try #require(throws: PostgresError.self) { try db.execute("SELECT 1") }
        #expect(lost.isConnectionLost && !db.isConnected, "\(lost)")
        #expect(throws: PostgresError.self) { try db.reset() }
        try server.start()
        try db.reset()
        #expect(try db.execute("SELECT v FROM kept").int(0, 0) == 7)
    }

    @Test(
        "with a deadline, a call on a server process that stopped answering gives up within it (plain and prepared), and reset reconnects"
    )
    func deadline() throws {
        for (sql, parameters) in [("SELECT 1", []), ("SELECT $1::int", [PostgresValue.int(2)])] {
            let db = try PostgresConnection(server.url, deadline: 0.5)
            #expect(try db.execute("SHOW statement_timeout").string(0, 0) == "500ms")
            let backend = Int32(try #require(try db.execute("SELECT pg_backend_pid()").int(0, 0)))
            // Stopped, the backend's kernel still takes the bytes: only the client's own bound
            // ends the wait.
            kill(backend, SIGSTOP)
            let started = Date()
            #expect(throws: PostgresError.self) { try db.execute(sql, parameters) }
            let waited = Date().timeIntervalSince(started)
            // Given up, it takes no statement more: its session may still read what it was sent.
            let again = Date()
            #expect(throws: PostgresError.self) { try db.execute("SELECT 1") }
            #expect(Date().timeIntervalSince(again) < 0.1)
            kill(backend, SIGCONT)
            #expect(waited >= 0.45 && waited < 2, "\(sql): \(waited) s")
            #expect(!db.isConnected)
            try db.reset()
            #expect(db.isConnected)
            #expect(try db.execute("SELECT $1::int", [.int(3)]).int(0, 0) == 3)
        }
        // A pipeline to a stopped process gives up within the deadline too (its answers share one).
        let db = try PostgresConnection(server.url, deadline: 0.5)
        let backend = Int32(try #require(try db.execute("SELECT pg_backend_pid()").int(0, 0)))
        kill(backend, SIGSTOP)
        defer { kill(backend, SIGCONT) }
        let started = Date()
        #expect(throws: PostgresError.self) {
            try db.pipeline([("BEGIN", []), ("SELECT 1", []), ("SELECT 2", []), ("COMMIT", [])])
        }
        let waited = Date().timeIntervalSince(started)
        #expect(waited >= 0.45 && waited < 1, "the pipeline waited \(waited) s")
        // And takes no pipeline more: one would queue behind the unanswered one, on the same session.
        let again = Date()
        #expect(throws: PostgresError.self) { try db.pipeline([("SELECT 3", [])]) }
        let refusedAfter = Date().timeIntervalSince(again)
        #expect(refusedAfter < 0.1, "a pipeline on the connection given up took \(refusedAfter) s")
    }
}
