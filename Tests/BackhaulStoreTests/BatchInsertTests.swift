import BackhaulCore
import Foundation
import SQLite
import Testing
import Threads

@testable import BackhaulQueue
@testable import BackhaulSQLite

/// New tasks are written many rows a statement (`RowInsert`), numbered by the writer itself, and
/// their events after them: these tests hold that to what one row at a time gave.
@Suite("Batch inserts")
struct BatchInsertTests {
    let store: Store

    init() throws {
        store = try Store(path: ":memory:")
    }

    func session(_ id: String, enabled: Bool = true, quota: Int64? = nil) throws {
        try Self.session(store, id, enabled: enabled, quota: quota)
    }

    func sequences(_ session: String) throws -> [String: Int64] {
        try store.read { db in
            Dictionary(
                uniqueKeysWithValues: try db.query("SELECT id, seq FROM tasks WHERE session_id = ?", [session]) {
                    ($0.string(0), $0.int(1))
                })
        }
    }

    /// The writer numbers new tasks past the autoincrement's high-water mark, not past the
    /// newest row: a task deleted at the top must not have its number given again (a list's
    /// cursor, the engine's queue, are by number).
    @Test("a batch's tasks are numbered in order, past every task there ever was")
    func numbering() throws {
        try session("s")
        _ = try store.createTasks(sessionID: "s", [makeTask("a"), makeTask("b"), makeTask("top")])
        let top = try #require(try sequences("s")["top"])
        _ = try store.apply(.cancel, to: "top")
        try store.deleteTask(id: "top")
        let ids = (0..<45).map { "n\($0)" }  // 32 + 8 + 5 rows
        let created = try store.createTasks(sessionID: "s", ids.map { makeTask($0) })
        #expect(created.allSatisfy { $0.1 })
        let numbers = try sequences("s")
        #expect(created.map(\.0.sequence) == ids.map { numbers[$0]! }, "each task answered with its stored number")
        #expect(ids.map { numbers[$0]! } == Array(top + 1...top + 45))
        let page = try store.tasks(sessionID: "s", state: nil, cursor: nil, limit: 100)
        #expect(page.tasks.map(\.id) == ["a", "b"] + ids)
    }

    /// Makes the session `id` in `store`.
    static func session(_ store: any StateStore, _ id: String, enabled: Bool = true, quota: Int64? = nil) throws {
        var configuration = TransferConfiguration()
        configuration.quotaBytes = quota
        _ = try store.putSession(id: id, configuration: configuration)
        if !enabled { _ = try store.updateSession(id: id, cancelPending: false) { _ in (nil, false) } }
    }

    /// In a disabled session each new task has its `task.waiting` event; one the quota refuses is
    /// created cancelled and written alone, between the ones before and after it.
    @Test("a batch's events come in its tasks' order, a task the quota refuses in its place", arguments: Backend.allCases)
    func eventOrder(_ backend: Backend) throws {
        let store = try backend.open()
        defer { store.close() }
        try Self.session(store, "q", enabled: false, quota: 31)
        var tasks = (0..<12).map { makeTask("w\($0)", session: "q") }
        tasks[3].file.size = 30  // 3 + 30 > 31 after the first three: refused; the rest fit
        for index in tasks.indices where index != 3 { tasks[index].file.size = 1 }
        let created = try store.createTasks(sessionID: "q", tasks)
        #expect(
            created.map(\.0.state) == Array(repeating: .waiting, count: 3) + [.cancelled] + Array(repeating: .waiting, count: 8))
        let events = try store.events(after: 0, session: "q").filter { $0.taskID != nil }
        #expect(events.map(\.taskID) == tasks.map(\.id))
        #expect(
            events.map(\.type) == Array(repeating: "task.waiting", count: 3) + ["task.cancelled"]
                + Array(repeating: "task.waiting", count: 8))
        #expect(events.map(\.sequence) == events.map(\.sequence).sorted())
    }

    /// A session with a webhook gets a delivery for each event (the outbox), written with it.
    @Test("a batch into a session with a webhook queues a delivery for each event")
    func deliveries() throws {
        try session("h", enabled: false)
        try store.createWebhook(
            WebhookRecord(
                id: "wh", sessionID: "h", url: "http://127.0.0.1:9/", events: [.taskWaiting], secret: "c2VjcmV0", createdAt: 1))
        let created = try store.createTasks(sessionID: "h", (0..<10).map { makeTask("d\($0)", session: "h") })
        #expect(created.count == 10)
        let pending = try store.read { db in
            try db.query(
                "SELECT e.task_id FROM deliveries d JOIN events e ON e.seq = d.event_seq WHERE d.webhook_id = 'wh' ORDER BY d.seq",
                []
            ) { $0.string(0) }
        }
        #expect(pending == (0..<10).map { "d\($0)" })
    }

    /// Two batches in one transaction each read where numbering stands, and a transaction run
    /// again (a job in it threw) numbers afresh: no number twice, none skipped.
    @Test("batches sharing a transaction, run again after a job threw, are numbered one after the other")
    func numberingInOneTransaction() throws {
        try session("t")
        _ = try store.createTasks(sessionID: "t", [makeTask("before", session: "t")])
        // A write that keeps the writer busy, so that the three after it come as one batch.
        let entered = Locked(false)
        let gate = Locked(false)
        Thread.detachNewThread { [store] in
            _ = try? store.write { _ in
                entered.withLockNotifyingAll { $0 = true }
                gate.wait(until: { $0 }, timeout: 10) { _ in }
            }
        }
        #expect(entered.wait(until: { $0 }, timeout: 10) { $0 })
        let first = store.createTasks(sessionID: "t", TaskBatch((0..<3).map { makeTask("f\($0)", session: "t") }))
        let failing = store.createTasks(sessionID: "missing", TaskBatch([makeTask("x", session: "missing")]))
        let second = store.createTasks(sessionID: "t", TaskBatch((0..<2).map { makeTask("g\($0)", session: "t") }))
        gate.withLockNotifyingAll { $0 = true }
        #expect(try first.wait().count == 3)
        #expect(throws: StoreError.self) { try failing.wait() }
        #expect(try second.wait().count == 2)
        let numbers = try sequences("t")
        let order = ["before", "f0", "f1", "f2", "g0", "g1"].map { numbers[$0]! }
        #expect(order == Array(order[0]...order[0] + 5))
    }

    /// A task the quota refuses ends at once; when it was the session's only one, the session is
    /// drained, as when a task ends any other way.
    @Test("a refused task alone in its session drains it", arguments: Backend.allCases)
    func refusedAloneDrains(_ backend: Backend) throws {
        let store = try backend.open()
        defer { store.close() }
        try Self.session(store, "r", quota: 0)
        var task = makeTask("big", session: "r")
        task.file.size = 1
        let created = try store.createTasks(sessionID: "r", [task])
        #expect(created.map(\.0.state) == [.cancelled])
        #expect(try store.events(after: 0, session: "r").map(\.type) == ["task.cancelled", "session.drained"])
    }
}
