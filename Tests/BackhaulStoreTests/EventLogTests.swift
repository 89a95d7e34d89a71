import BackhaulCore
import BackhaulPostgres
import Glibc
import PostgreSQL
import SQLite
import Testing

@testable import BackhaulQueue
@testable import BackhaulSQLite

@Suite("Event log")
struct EventLogTests {
    static func scratch(_ name: String) -> String { "/tmp/backhaul-\(name)-\(getpid())-\(Int.random(in: 0..<1_000_000)).db" }

    static func remove(_ path: String) { for suffix in ["", "-wal", "-shm", ".v10.backup"] { unlink(path + suffix) } }

    static func insertEvent(_ db: Connection, at time: Timestamp, task: String? = nil) throws -> Int64 {
        try db.run(
            "INSERT INTO events (id, type, session_id, task_id, created_at, data) VALUES (?, 'task.waiting', 's', ?, ?, '{}')",
            [RandomID.make(prefix: "msg_", at: time), task, time])
        return db.lastInsertRowID
    }

    /// Migration 11 copies the events table (to drop the UNIQUE index on ids). A copy numbers its
    /// rows from its own high-water mark: without carrying the old one over, a seq whose event was
    /// pruned would be given again, and an SSE client resuming after it would miss the new event.
    @Test("migrating the event log keeps every event and never gives a seq twice")
    func migrationKeepsSequence() throws {
        let path = Self.scratch("events-v10")
        defer { Self.remove(path) }
        do {
            let db = try Connection(path: path)
            try db.execute("PRAGMA journal_mode = WAL")
            try Migrator(migrations: Schema.migrations.filter { $0.version <= 10 }).migrate(db)
            for time in [100.0, 200, 300, 400] { _ = try Self.insertEvent(db, at: time, task: "tsk_a") }
            try db.run("DELETE FROM events WHERE seq >= 3")
        }
        let store = try Store(path: path)
        store.close()
        let db = try Connection(path: path)
        #expect(try db.queryFirst("PRAGMA user_version") { $0.int(0) } == Int64(Migrator(migrations: Schema.migrations).latest))
        #expect(
            try db.query("SELECT seq, created_at FROM events ORDER BY seq") { [$0.int(0), Int64($0.double(1))] } == [
                [1, 100], [2, 200],
            ])
        #expect(try Self.insertEvent(db, at: 500) == 5)
        let indexes = try db.query("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' ORDER BY name") {
            $0.string(0)
        }
        #expect(indexes == ["events_by_session", "events_by_task"])
    }

    /// The event log of a store, written and read behind its back: events of a given date, a
    /// pending delivery that pins one, and the events left.
    struct EventTable {
        var insert: (Timestamp) throws -> Int64
        var pin: (_ event: Int64, _ now: Timestamp) throws -> Void
        var left: () throws -> [Int64]
    }

    /// A store of `backend` on a clock held still, and its event log beside it.
    static func withStore(_ backend: Backend, _ body: (any StateStore, EventTable, Timestamp) throws -> Void) throws {
        let clock = ManualClock()
        let pinning = """
            INSERT INTO deliveries (webhook_id, event_seq, event_type, state, next_attempt_at, created_at)
            VALUES ('wh', $1, 'task.waiting', 'pending', $2, $2)
            """
        switch backend {
        case .sqlite:
            let path = Self.scratch("events")
            defer { Self.remove(path) }
            let store = try Store(path: path, clock: clock)
            defer { store.close() }
            let db = try Connection(path: path)
            let table = EventTable(
                insert: { time in try Self.insertEvent(db, at: time) },
                pin: { event, now in try db.run(pinning, [event, now]) },
                left: { try db.query("SELECT seq FROM events ORDER BY seq") { $0.int(0) } })
            try body(store, table, clock.now())
        case .postgres:
            let store = try backend.open(clock: clock)
            defer { store.close() }
            let db = try PostgresConnection(try #require(store as? PostgresStore).options.url)
            let table = EventTable(
                insert: { time in
                    let rows = try db.execute(
                        """
                        INSERT INTO events (id, type, session_id, task_id, created_at, data)
                        VALUES ($1, 'task.waiting', 's', NULL, $2, '{}') RETURNING seq
                        """, [.text(RandomID.make(prefix: "msg_", at: time)), .double(time)])
                    return try #require(rows.int(0, 0))
                },
                pin: { event, now in _ = try db.execute(pinning, [.int(event), .double(now)]) },
                left: {
                    let rows = try db.execute("SELECT seq FROM events ORDER BY seq")
                    return (0..<rows.count).compactMap { rows.int($0, 0) }
                })
            try body(store, table, clock.now())
        }
    }

    @Test(
        "age pruning takes the events older than the retention, in seq order, and keeps one a delivery still needs",
        arguments: Backend.allCases)
    func agePruning(_ backend: Backend) throws {
        try Self.withStore(backend) { store, events, now in
            var seqs: [Int64] = []
            for age in [500.0, 400, 300, 200, 100, 50, 10] { seqs.append(try events.insert(now - age)) }
            // The second oldest is pinned by a pending delivery; one out of time order (the clock
            // stepped back) waits behind the first event young enough to keep.
            try events.pin(seqs[1], now)
            let stepped = try events.insert(now - 1000)
            #expect(try store.pruneEventLog(olderThan: 150, batch: 2) == 2)
            #expect(try store.pruneEventLog(olderThan: 150) == 1)
            #expect(try store.pruneEventLog(olderThan: 150) == 0)
            #expect(try events.left() == [seqs[1], seqs[4], seqs[5], seqs[6], stepped])
            #expect(try store.pruneEventLog(olderThan: 5) == 4)
            #expect(try events.left() == [seqs[1]])
        }
    }

    /// Written while the clock was ahead, an event is dated after now: it must not stop the sweep
    /// for the old events after it (nothing would be pruned until the clock caught up).
    @Test("an event dated after now neither goes nor holds back the old events after it", arguments: Backend.allCases)
    func futureDated(_ backend: Backend) throws {
        try Self.withStore(backend) { store, events, now in
            let old = try events.insert(now - 500)
            let ahead = try events.insert(now + 3600)
            let older = try events.insert(now - 400)
            let young = try events.insert(now - 10)
            #expect(try store.pruneEventLog(olderThan: 150) == 2)
            #expect(try events.left() == [ahead, young])
            #expect(old < ahead && ahead < older)
        }
    }
}
