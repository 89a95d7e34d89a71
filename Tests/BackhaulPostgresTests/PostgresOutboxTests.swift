import BackhaulCore
import BackhaulPostgres
import BackhaulQueue
import BackhaulTesting
import Foundation
import PostgreSQL
import Testing
import Threads

/// The PostgreSQL store's outbox, cleanups, settings and retention against a real PostgreSQL, with
/// two nodes on one database where the fleet's rules matter (docs/fleet.md): a delivery or a
/// cleanup is claimed by one node at a time, and a stopped node's claim runs out.
@Suite("PostgreSQL store: outbox, cleanups, settings, retention", .serialized)
final class PostgresOutboxTests {
    let server: PostgresServer
    private let clock = StepClock()

    init() throws { server = try PostgresServer() }

    /// How long a claim lasts: short, yet long enough that a loaded machine runs a test's steps
    /// between a claim and its check well within it.
    let lease = 2.0

    /// A node of the fleet on the test's database.
    func node(_ id: String) throws -> PostgresStore {
        var options = PostgresStore.Options(url: server.url, node: id)
        options.leaseSeconds = lease
        return try PostgresStore(options, clock: clock)
    }

    /// Nodes a and b on the test's database.
    func twoNodes() throws -> (PostgresStore, PostgresStore) { (try node("a"), try node("b")) }

    /// The session "s" on `store`, with the subscription "w" to `events`.
    func subscribedSession(on store: PostgresStore, to events: [EventType] = [.taskCompleted]) throws {
        _ = try store.putSession(id: "s", configuration: TransferConfiguration())
        try store.createWebhook(
            WebhookRecord(
                id: "w", sessionID: "s", url: "http://127.0.0.1:9/", events: events, secret: "whsec_a",
                createdAt: clock.now()))
    }

    @Test("a due delivery is claimed by one node; the other gets it once the claim ends, with the same webhook-id")
    func claims() throws {
        let (a, b) = try twoNodes()
        defer {
            a.close()
            b.close()
        }
        try subscribedSession(on: a)
        _ = try a.createTasks(sessionID: "s", [makeTask("t1", now: clock.now())])
        try a.complete("t1")
        let pending = try a.deliveries(webhookID: "w", state: .pending, cursor: nil, limit: 10).deliveries
        #expect(pending.count == 1)
        let event = try #require(try b.events(after: 0).first { $0.type == "task.completed" })
        #expect(pending.first?.eventID == event.id)

        let claimed = try a.dueDeliveries(now: clock.now(), limit: 10, excluding: [])
        #expect(claimed.map(\.eventID) == [event.id])
        #expect(claimed.first.map { String(decoding: $0.payload, as: UTF8.self) } == event.payloadText)
        let sequence = try #require(claimed.first?.sequence)
        // While a's claim holds, b neither gets it nor counts it due before the claim ends.
        #expect(try b.dueDeliveries(now: clock.now(), limit: 10, excluding: []).isEmpty)
        let wait = try #require(try b.nextDeliveryAt(excluding: []))
        #expect(wait > clock.now() && wait <= clock.now() + lease + 0.05)
        #expect(try a.nextDeliveryAt(excluding: [sequence]) == nil)
        #expect(try a.nextDeliveryAt(excluding: []) == event.createdAt)

        // a's attempt fails and is tried again later: its claim ends with it, so b takes it when due.
        try a.record(sequence, status: 503, .retry(at: clock.now() + 5))
        #expect(try b.dueDeliveries(now: clock.now(), limit: 10, excluding: []).isEmpty)
        #expect(try b.nextDeliveryAt(excluding: []) == clock.now() + 5)
        clock.advance(5)
        let taken = try b.dueDeliveries(now: clock.now(), limit: 10, excluding: [])
        #expect(taken.map(\.eventID) == [event.id] && taken.first?.attempts == 1)
        #expect(try a.dueDeliveries(now: clock.now(), limit: 10, excluding: []).isEmpty)

        // b stops without recording: a takes the delivery over once b's claim ran out.
        Thread.sleep(forTimeInterval: lease + 0.2)
        let takenOver = try a.dueDeliveries(now: clock.now(), limit: 10, excluding: [])
        #expect(takenOver.map(\.eventID) == [event.id])
        // b's late result is written, but a's claim stays: a is sending it now.
        try b.record(sequence, status: nil, .retry(at: clock.now() + 5))
        let db = try PostgresConnection(server.url)
        #expect(try db.execute("SELECT claimed_by FROM deliveries WHERE seq = $1", [.int(sequence)]).string(0, 0) == "a")
        try a.record(sequence, status: 200, .delivered)
        let delivered = try a.deliveries(webhookID: "w", state: nil, cursor: nil, limit: 10).deliveries
        #expect(delivered.map(\.state) == [.delivered] && delivered.first?.attempts == 3)
        #expect(try db.execute("SELECT count(*) FROM deliveries WHERE claimed_by IS NOT NULL").int(0, 0) == 0)
        #expect(try b.deliveryCounts() == [.delivered: 1])
    }

    @Test("session.drained waits for every earlier delivery of its subscription, whichever node holds it")
    func drainedComesLast() throws {
        let (a, b) = try twoNodes()
        defer {
            a.close()
            b.close()
        }
        try subscribedSession(on: a, to: [.taskCompleted, .sessionDrained])
        _ = try a.createTasks(sessionID: "s", [makeTask("t1", now: clock.now())])
        try a.complete("t1")
        #expect(try a.deliveries(webhookID: "w", state: .pending, cursor: nil, limit: 10).deliveries.count == 2)

        let first = try a.dueDeliveries(now: clock.now(), limit: 10, excluding: [])
        #expect(
            first.count == 1
                && first.first.map { String(decoding: $0.payload, as: UTF8.self) }?.contains("task.completed") == true)
        let completed = try #require(first.first?.sequence)
        // The drained event is held on both nodes while the completion is pending.
        #expect(try b.dueDeliveries(now: clock.now(), limit: 10, excluding: []).isEmpty)
        #expect(try a.nextDeliveryAt(excluding: [completed]) == nil)
        try a.record(completed, status: 500, .retry(at: clock.now() + 1))
        #expect(try b.dueDeliveries(now: clock.now(), limit: 10, excluding: []).isEmpty)

        clock.advance(1)
        let again = try b.dueDeliveries(now: clock.now(), limit: 10, excluding: [])
        #expect(again.map(\.sequence) == [completed])
        try b.record(completed, status: 204, .delivered)
        let drained = try a.dueDeliveries(now: clock.now(), limit: 10, excluding: [])
        #expect(drained.count == 1)
        #expect(drained.first.map { String(decoding: $0.payload, as: UTF8.self) }?.contains("\"session.drained\"") == true)
    }

    @Test("events in commit order, after a sequence: all, of one session, of the sessions a client may see")
    func events() throws {
        let (a, b) = try twoNodes()
        defer {
            a.close()
            b.close()
        }
        #expect(try b.lastEventSequence() == 0)
        for session in ["s", "t", "u"] {
            _ = try a.putSession(id: session, configuration: TransferConfiguration())
            var task = makeTask("task-\(session)", now: clock.now())
            task.sessionID = session
            _ = try a.createTasks(sessionID: session, [task])
            try a.complete("task-\(session)")
        }
        // Each session: its task's completion, then its drain.
        let all = try b.events(after: 0)
        #expect(all.map(\.sessionID) == ["s", "s", "t", "t", "u", "u"])
        #expect(all.map(\.type) == Array(repeating: ["task.completed", "session.drained"], count: 3).flatMap { $0 })
        #expect(try a.lastEventSequence() == all.last?.sequence)
        let second = try #require(all.dropFirst().first?.sequence)
        #expect(try a.events(after: second).count == 4)
        #expect(try a.events(after: 0, session: "t").map(\.taskID) == ["task-t", nil])
        // A client scoped to s and u: filtered page by page.
        let scoped = try a.events(after: 0, session: nil, limit: 3, sessions: { $0 != "t" })
        #expect(scoped.map(\.sessionID) == ["s", "s", "u"])
    }

    @Test("a cleanup is run by one node at a time; a stopped node's claim runs out")
    func cleanups() throws {
        let (a, b) = try twoNodes()
        defer {
            a.close()
            b.close()
        }
        let plan = CleanupPlan(request: PlannedRequest(method: "DELETE", url: "http://h/files/1", headers: [], body: .empty))
        let db = try PostgresConnection(server.url)
        try db.execute(
            "INSERT INTO cleanups (task_id, request, next_attempt_at, created_at) VALUES ('t1', $1, $2, $2)",
            [.text(plan.json.serialized()), .double(clock.now())])
        let claimed = try a.dueCleanups(now: clock.now(), limit: 5, excluding: [])
        #expect(claimed.count == 1 && claimed.first?.taskID == "t1")
        #expect(try claimed.first?.plan.get() == plan)
        #expect(try b.dueCleanups(now: clock.now(), limit: 5, excluding: []).isEmpty)
        Thread.sleep(forTimeInterval: lease + 0.2)
        let sequence = try #require(claimed.first?.sequence)
        #expect(try b.dueCleanups(now: clock.now(), limit: 5, excluding: []).map(\.sequence) == [sequence])
        try b.recordCleanup(sequence: sequence, retryAt: clock.now() + 2)
        #expect(try a.dueCleanups(now: clock.now() + 2, limit: 5, excluding: []).map(\.attempts) == [1])
        // A listing that found two uploads: each goes in as a cleanup of its own, the listing goes.
        #expect(try a.replaceCleanup(sequence: sequence, with: [("u1", plan), ("u2", plan)]) == 2)
        #expect(try b.dueCleanups(now: clock.now(), limit: 5, excluding: []).count == 2)
    }

    @Test("settings round-trip and are heard by the other node; budget use adds up across nodes")
    func settingsAndBudgets() throws {
        let (a, b) = try twoNodes()
        defer {
            a.close()
            b.close()
        }
        let heard = Locked<Set<String>>([])
        b.observe { changes in heard.withLockNotifyingAll { $0.formUnion(changes.settings) } }
        b.startFleet()
        let local = Locked<Set<String>>([])
        a.observe { changes in local.withLock { $0.formUnion(changes.settings) } }

        let staged = Locked(0)
        try a.setSetting("policy", ["discretionary_window": "22:00-06:00"], staging: { staged.withLock { $0 += 1 } })
        #expect(staged.withLock { $0 } == 1)
        #expect(try b.setting("policy") == ["discretionary_window": "22:00-06:00"])
        #expect(local.withLock { $0 } == ["policy"])
        // The other node hears it through NOTIFY, once its listener has connected (on a thread of
        // its own: a change committed before it listens is not sent to it, so the setting is
        // written again until one is heard).
        var rounds = 0
        while !heard.wait(until: { $0.contains("policy") }, timeout: 0.5, { $0.contains("policy") }), rounds < 20 {
            try a.setSetting("policy", ["discretionary_window": "22:00-06:00"])
            rounds += 1
        }
        #expect(heard.withLock { $0 } == ["policy"])
        try b.setSetting("policy", nil)
        #expect(try a.setting("policy") == nil)

        a.addBudgetUsage(day: "2025-01-01", [.wifi: 100, .cellular: 7])
        b.addBudgetUsage(day: "2025-01-01", [.wifi: 50])
        a.addBudgetUsage(day: "2025-01-01", [.cellular: 3, .wired: 0])
        #expect(try eventually { try a.budgetUsage(day: "2025-01-01") == [.wifi: 150, .cellular: 10] })
        // A new day's use forgets the days before.
        b.addBudgetUsage(day: "2025-01-02", [.wifi: 1])
        #expect(try eventually { try a.budgetUsage(day: "2025-01-01").isEmpty })
        #expect(try b.budgetUsage(day: "2025-01-02") == [.wifi: 1])
    }

    /// What a node missed while it did not listen (its LISTEN connection lost, or not yet made) is
    /// read again once it listens, the settings included.
    @Test("a policy set while another node does not listen is in force there once it listens")
    func policyReadAfterListening() throws {
        let (a, b) = try twoNodes()
        defer {
            a.close()
            b.close()
        }
        let settings = try ServiceSettings(store: b, basePolicy: ServicePolicy(), classifier: NetworkClassifier())
        #expect(settings.policy.transfersEnabled)
        // b does not listen yet: the change's NOTIFY does not reach it.
        try ServiceSettings(store: a, basePolicy: ServicePolicy(), classifier: NetworkClassifier())
            .setPolicy(try ServicePolicy().applying(["transfers_enabled": false]))
        #expect(settings.policy.transfersEnabled)
        b.startFleet()
        #expect(eventually(timeout: 2) { !settings.policy.transfersEnabled }, "b still has transfers enabled")
    }

    @Test("retention removes finished tasks past it with their events, once nothing is pending for them")
    func retention() throws {
        let a = try node("a")
        defer { a.close() }
        try subscribedSession(on: a)
        _ = try a.createTasks(sessionID: "s", [makeTask("old", now: clock.now()), makeTask("new", now: clock.now())])
        let start = clock.now()
        try a.complete("old")
        clock.advance(50)
        try a.complete("new")
        clock.advance(70)
        #expect(try a.oldestFinishedTask(now: clock.now()) == 120)

        // Past its retention, but its completion is still to be delivered: kept.
        #expect(try a.pruneFinishedTasks(defaultRetention: 100, batch: 10) == 0)
        let due = try a.dueDeliveries(now: clock.now(), limit: 10, excluding: [])
        #expect(due.count == 2)
        for delivery in due { try a.record(delivery.sequence, status: 200, .delivered) }
        #expect(try a.pruneFinishedTasks(defaultRetention: 100, batch: 10) == 1)
        #expect(try a.task(id: "old") == nil)
        #expect(try a.task(id: "new")?.state == .completed)
        #expect(try a.events(after: 0).allSatisfy { $0.taskID != "old" })
        #expect(try a.events(after: 0).contains { $0.taskID == "new" })
        #expect(try a.oldestFinishedTask(now: clock.now()) == 70)

        // A session's own retention, shorter than the daemon's, is the one in force.
        var short = TransferConfiguration()
        short.finishedTaskRetention = 10
        _ = try a.putSession(id: "brief", configuration: short)
        #expect(try a.shortestRetention(defaultRetention: 100) == 10)
        #expect(try a.vacuumFreePages(100) == 0)

        // The event log: what is older than its retention and pinned by nothing goes.
        let events = try a.events(after: 0)
        #expect(events.allSatisfy { $0.createdAt >= start + 50 })
        #expect(try a.pruneEventLog(olderThan: 60, batch: 100) == events.count)
        #expect(try a.events(after: 0).isEmpty)
        #expect(try a.deliveryCounts().isEmpty)
        // What went is counted for /metrics, as the SQLite store counts it.
        let figures = a.maintenanceFigures
        #expect(figures.tasksPruned == 1 && figures.eventsPruned > events.count && figures.commits > 0, "\(figures)")
    }
}

/// A clock the test moves by hand (the stored times); leases and claims follow the database's.
private final class StepClock: Clock {
    private let time = Locked(1_000_000.0)
    func now() -> Timestamp { time.withLock { $0 } }
    func advance(_ seconds: Double) { time.withLock { $0 += seconds } }
}

/// Polls `condition` for up to five seconds (for writes handed over without waiting).
private func eventually(_ condition: () throws -> Bool) throws -> Bool {
    let deadline = Date().addingTimeInterval(5)
    while Date() < deadline {
        if try condition() { return true }
        Thread.sleep(forTimeInterval: 0.02)
    }
    return try condition()
}

extension PostgresStore {
    /// Runs the task's attempt to completion, as the engine would.
    fileprivate func complete(_ id: String) throws {
        let queued = try #require(try task(id: id))
        let started = try #require(try answer { done in startAttempt(queued, done: done) })
        let now = SystemClock().now()
        let history = AttemptRecord(startedAt: now, endedAt: now, bytesTransferred: 10, bytesReceived: 0, outcome: .completed)
        let finished = try answer { done in
            finishAttempt(started, bytesTransferred: 10, end: .completed(nil), history: history, done: done)
        }
        #expect(finished?.state == .completed)
    }

    /// Records a delivery attempt and waits for it to commit.
    fileprivate func record(_ sequence: Int64, status: Int?, _ decision: DeliveryPlan.Decision) throws {
        let failure: StoreError?? = try answer { done in
            recordDeliveryAttempt(sequence: sequence, status: status, error: nil, decision: decision) { error in
                done(.success(error))
            }
        }
        if let failure, let failure { throw failure }
    }
}
