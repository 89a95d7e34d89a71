import BackhaulCore
import BackhaulQueue
import BackhaulTesting
import Foundation
import PostgreSQL
import Testing
import Threads

@testable import BackhaulPostgres

/// A connection lost right after its COMMIT went out (docs/fleet.md, "Faults"): the writer asks
/// the server whether the transaction committed, and never runs a committed one again. A proxy of
/// the test's own stands between the node and a real PostgreSQL and drops the connection right
/// after it forwarded the COMMIT.
@Suite("PostgreSQL store: a COMMIT whose answer is lost", .serialized)
final class LostCommitTests {
    let server: PostgresServer
    let proxy: PostgresProxy

    init() throws {
        server = try PostgresServer()
        proxy = try PostgresProxy(to: server)
    }

    deinit { proxy.stop() }

    /// A node whose every connection goes through the proxy, with the session "s".
    func node() throws -> PostgresStore {
        let store = try PostgresStore(PostgresStore.Options(url: proxy.url, node: "a"))
        _ = try store.putSession(id: "s", configuration: TransferConfiguration())
        return store
    }

    @Test("a batch without idempotency keys whose COMMIT's answer is lost, 5 times: each answered once, stored once")
    func batchWithoutKeys() throws {
        let store = try node()
        defer { store.close() }
        let db = try PostgresConnection(server.url)
        let now = store.now
        for round in 0..<5 {
            proxy.dropAfterCommit(containing: "INSERT INTO tasks")
            let tasks = (0..<20).map { makeTask("tsk_r\(round)_\($0)", now: now) }
            let created = try store.createTasks(sessionID: "s", tasks, maxOpen: 100_000)
            #expect(created.count == 20 && created.allSatisfy(\.1), "round \(round): \(created.count) answered")
            let stored = try db.execute("SELECT count(*) FROM tasks WHERE id LIKE $1", [.text("tsk_r\(round)_%")]).int(0, 0)
            #expect(stored == 20, "round \(round): \(stored ?? -1) rows for 20 tasks")
        }
        #expect(proxy.dropped == 5)
        #expect(store.writer.doubts.withLock { $0 }.committed == 5, "\(store.writer.doubts.withLock { $0 })")
        // The count of unfinished tasks went up once per task.
        #expect(try db.execute("SELECT open_tasks FROM sessions WHERE id = 's'").int(0, 0) == 100)
    }

    @Test("a batch with idempotency keys whose COMMIT's answer is lost: the same tasks, stored once, and its retry finds them")
    func batchWithKeys() throws {
        let store = try node()
        defer { store.close() }
        let now = store.now
        proxy.dropAfterCommit(containing: "INSERT INTO tasks")
        let tasks = (0..<20).map { index -> TaskRecord in
            var task = makeTask("tsk_k\(index)", now: now)
            task.idempotencyKey = "key-\(index)"
            return task
        }
        let first = try store.createTasks(sessionID: "s", tasks, maxOpen: 100_000)
        #expect(first.map(\.0.id) == tasks.map(\.id) && first.allSatisfy(\.1))
        // A client's retry with the same keys (new ids) gets the tasks that committed.
        let retried = tasks.enumerated().map { index, task -> TaskRecord in
            var again = task
            again.id = "tsk_again\(index)"
            return again
        }
        let second = try store.createTasks(sessionID: "s", retried, maxOpen: 100_000)
        #expect(second.map(\.0.id) == tasks.map(\.id) && second.allSatisfy { !$0.1 })
        let db = try PostgresConnection(server.url)
        #expect(try db.execute("SELECT count(*) FROM tasks").int(0, 0) == 20)
        #expect(proxy.dropped == 1)
    }

    @Test("budget usage whose COMMIT's answer is lost is counted once")
    func budgetCountedOnce() throws {
        let store = try node()
        defer { store.close() }
        proxy.dropAfterCommit(containing: "budget_usage")
        store.addBudgetUsage(day: "2026-11-28", [.cellular: 1_000])
        try store.settle()
        #expect(proxy.dropped == 1)
        #expect(try store.budgetUsage(day: "2026-11-28") == [.cellular: 1_000])
    }

    /// A COMMIT sent to a server process that then stops (SIGSTOP: its socket open, the bytes in
    /// its buffer unread): the writer gives the call up after a lease, and must not take the
    /// row's old token as "not committed", since the stopped process would run the COMMIT once it
    /// runs again. It tells the process to end and waits until it has: here it never does within
    /// the writer's time, so the write fails `unavailable`, and once the process runs again it ends
    /// without committing. Before, the writer read the old token at once, ran the transaction
    /// again, and the stopped one committed too: the row twice.
    @Test("a COMMIT sent to a server process that stopped is never run twice: the process is ended first")
    func commitToStoppedProcess() throws {
        var options = PostgresStore.Options(url: server.url, node: "a")
        options.leaseSeconds = 1
        let store = try PostgresStore(options)
        defer { store.close() }
        store.writer.reconnectFor = 3
        let db = try PostgresConnection(server.url)
        try db.execute("CREATE TABLE doubt_runs (n int)")
        let stopped = Locked<Int32>(0)
        let result = Locked<Result<Void, StoreError>?>(nil)
        let body: (PostgresTransaction) throws -> Void = { tx in
            try tx.execute("INSERT INTO doubt_runs VALUES (1)")
            // The first run's process stops before the writer sends the transaction's end.
            guard stopped.withLock({ $0 == 0 }) else { return }
            let pid = Int32(try tx.execute("SELECT pg_backend_pid()").int(0, 0) ?? 0)
            stopped.withLock { $0 = pid }
            kill(pid, SIGSTOP)
        }
        store.submit(durable: true, body, done: { outcome in result.withLockNotifyingAll { $0 = outcome } })
        let outcome = result.wait(until: { $0 != nil }, timeout: 30) { $0 }
        let pid = stopped.withLock { $0 }
        try #require(pid > 0)
        kill(pid, SIGCONT)
        // The stopped process, running again, ends (or would commit, before).
        let gone = eventually(timeout: 10) {
            (try? db.execute("SELECT 1 FROM pg_stat_activity WHERE pid = $1::int", [.int(Int64(pid))]).count) == 0
        }
        #expect(gone)
        let rows = try db.execute("SELECT count(*) FROM doubt_runs").int(0, 0) ?? -1
        switch outcome {
        case .success?: #expect(rows == 1, "answered as committed; \(rows) rows")
        case .failure(.unavailable)?: #expect(rows <= 1, "answered unavailable; \(rows) rows")
        default: Issue.record("the write's outcome: \(String(describing: outcome)); \(rows) rows")
        }
        #expect(rows <= 1, "the transaction ran twice: \(rows) rows")
        let doubts = store.writer.doubts.withLock { $0 }
        print("commit to a stopped process: \(String(describing: outcome)), \(rows) rows, doubts \(doubts)")
    }
}
