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
}
