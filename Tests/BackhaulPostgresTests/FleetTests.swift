import BackhaulCore
import BackhaulQueue
import BackhaulTesting
import Foundation
import PostgreSQL
import Testing
import Threads

@testable import BackhaulPostgres

/// The PostgreSQL store's fleet rules against a real PostgreSQL: migrations, opening, claims,
/// leases, takeover, pinning (docs/fleet.md).
@Suite("PostgreSQL store: migrations, claims, leases, takeover", .serialized)
final class FleetTests {
    let server: PostgresServer

    init() throws { server = try PostgresServer() }

    @Test("nodes starting at once migrate once, under the advisory lock; an older node refuses a newer schema")
    func migrations() throws {
        let url = server.url
        let found = Locked<[Int]>([])
        let failures = Locked<[String]>([])
        concurrently(4) { _ in
            do {
                let before = try PostgresSchema.migrate(try PostgresConnection(url))
                found.withLock { $0.append(before) }
            } catch {
                failures.withLock { $0.append("\(error)") }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        // One found the empty database, the others the work done.
        #expect(found.withLock { $0 }.sorted() == [0] + Array(repeating: PostgresSchema.currentVersion, count: 3))
        let db = try PostgresConnection(url)
        #expect(try db.execute("SELECT count(*) FROM backhaul_schema").int(0, 0) == Int64(PostgresSchema.currentVersion))
        #expect(throws: PostgresSchema.Failure.newerSchema(database: PostgresSchema.currentVersion, known: 0)) {
            try PostgresSchema.migrate(db, upTo: 0)
        }
    }

    @Test("a session changed on one node is read anew on the other, whose record of it was kept")
    func sessionChangedElsewhere() throws {
        let (a, b) = try twoNodes()
        defer {
            a.close()
            b.close()
        }
        b.startFleet()
        #expect(
            try b.sessionRecord(id: "s")?.configuration.maxConnectionsPerHost == TransferConfiguration().maxConnectionsPerHost)
        // b keeps its record; a changes the session: b hears it and reads it again.
        var changed = TransferConfiguration()
        changed.maxConnectionsPerHost = 3
        let configuration = changed
        _ = try a.updateSession(id: "s", cancelPending: false) { _ in (configuration, nil) }
        let heard = eventually(timeout: 10) { (try? b.sessionRecord(id: "s"))?.configuration.maxConnectionsPerHost == 3 }
        #expect(heard, "b still shows the session as it was")
    }

    /// Nodes a and b on the test's database, with the session "s".
    func twoNodes(sharedRoots: [String] = []) throws -> (PostgresStore, PostgresStore) {
        func node(_ id: String) throws -> PostgresStore {
            var options = PostgresStore.Options(url: server.url, node: id)
            options.sharedRoots = sharedRoots
            return try PostgresStore(options)
        }
        let a = try node("a")
        let b = try node("b")
        _ = try a.putSession(id: "s", configuration: TransferConfiguration())
        return (a, b)
    }

    /// The database counts a task's revision, so a node's copy is found stale whoever changed the
    /// row: a node of an older version, or an operator by hand. A lease's renewal is no change.
    @Test("a change made by hand counts the revision, and a claim from the copy before it reads the row again")
    func revisionCountedByTheDatabase() throws {
        let (a, b) = try twoNodes(sharedRoots: ["/d"])
        defer {
            a.close()
            b.close()
        }
        let copy = try a.createTasks(sessionID: "s", [makeTask("t", now: SystemClock().now())])[0].0
        let db = try PostgresConnection(server.url)
        func revision() throws -> Int64? { try db.execute("SELECT revision FROM tasks WHERE id = 't'").int(0, 0) }
        try db.execute("UPDATE tasks SET priority = 0.875 WHERE id = 't'")
        #expect(try revision() == copy.revision + 1)
        let started = try #require(try answer { done in b.startAttempt(copy, done: done) })
        #expect(started.priority == 0.875 && started.revision == copy.revision + 2)
        #expect(try revision() == started.revision)
        try db.execute("UPDATE tasks SET lease_expires_at = clock_timestamp() + interval '1 minute' WHERE id = 't'")
        #expect(try revision() == started.revision)
    }

    /// A node claims from the copy its engine kept, which may be stale: the task another node has
    /// started meanwhile. That claim must not lock the row: the running node's end would wait for
    /// the claiming node's whole transaction (and two such nodes deadlock).
    @Test("a claim from a stale copy of a task another node runs leaves its row unlocked; that node's end does not wait")
    func staleClaimLocksNothing() throws {
        // Both see the task's file (a shared root), so either may run it.
        let (a, b) = try twoNodes(sharedRoots: ["/d"])
        defer {
            a.close()
            b.close()
        }
        let now = SystemClock().now()
        let copy = try a.createTasks(sessionID: "s", [makeTask("t", now: now)])[0].0
        let started = try #require(try answer { done in b.startAttempt(copy, done: done) })
        // a's writer held, so that its stale claim and a job that keeps the transaction open go
        // into one batch.
        let gates = Locked((first: false, entered: false, second: false))
        a.submit({ _ in gates.wait(until: { $0.first }, timeout: 10) { _ in } }, done: { _ in })
        let claim = Locked<Result<TaskRecord?, StoreError>?>(nil)
        a.startAttempt(copy) { answer in claim.withLockNotifyingAll { $0 = answer } }
        a.submit(
            { _ in
                gates.withLockNotifyingAll { $0.entered = true }
                gates.wait(until: { $0.second }, timeout: 10) { _ in }
            }, done: { _ in })
        gates.withLockNotifyingAll { $0.first = true }
        #expect(gates.wait(until: { $0.entered }, timeout: 10) { $0.entered })
        // a's transaction is open, its claim made: b ends its attempt meanwhile.
        let history = AttemptRecord(startedAt: now, endedAt: now, bytesTransferred: 10, bytesReceived: 0, outcome: .completed)
        let end = Locked<Result<TaskRecord?, StoreError>?>(nil)
        b.finishAttempt(started, bytesTransferred: 10, end: .completed(nil), history: history) { answer in
            end.withLockNotifyingAll { $0 = answer }
        }
        let ended = end.wait(until: { $0 != nil }, timeout: 3) { $0 }
        gates.withLockNotifyingAll { $0.second = true }
        #expect(try ended?.get()?.state == .completed, "b's end waited for a's transaction")
        #expect(try claim.wait(until: { $0 != nil }, timeout: 10) { $0 }?.get() == nil)
        #expect(try b.task(id: "t")?.state == .completed)
    }

    /// A new task's row is sent with the transaction's next statement, often its COMMIT, so a
    /// refusal shows after the job that wrote it returned: the batch runs again, each job in its
    /// savepoint, and only that job fails.
    @Test("a write sent with the commit and refused there fails its own job only; the rest of the batch commits")
    func refusedAtCommit() throws {
        let (a, b) = try twoNodes()
        defer {
            a.close()
            b.close()
        }
        let now = SystemClock().now()
        _ = try a.createTasks(sessionID: "s", [makeTask("dup", now: now)])
        // Alone in its transaction: refused, and nothing of it reaches the observers.
        let created = Locked<[String]>([])
        a.observe { changes in created.withLock { $0 += changes.created.map(\.id) } }
        #expect(throws: StoreError.self) { try a.createTasks(sessionID: "s", [makeTask("dup", now: now)]) }
        try a.settle()
        #expect(created.withLock { $0 }.isEmpty)
        // With another write in its transaction: only it fails.
        let gate = Locked(false)
        a.submit({ _ in gate.wait(until: { $0 }, timeout: 10) { _ in () } }, done: { _ in })
        let again = a.createTasks(sessionID: "s", TaskBatch([makeTask("dup", now: now)]), maxOpen: 100)
        let fresh = a.createTasks(sessionID: "s", TaskBatch([makeTask("new", now: now)]), maxOpen: 100)
        gate.withLockNotifyingAll { $0 = true }
        #expect(throws: StoreError.self) { try again.wait() }
        #expect(try fresh.wait().map(\.0.id) == ["new"])
        #expect(created.withLock { $0 } == ["new"])
        #expect(try a.tasks(sessionID: "s", state: nil, cursor: nil, limit: 10).tasks.map(\.id).sorted() == ["dup", "new"])
        #expect(try a.session(id: "s")?.1 == [.queued: 2])
    }

    /// Two nodes' writes that lock the same two rows in opposite orders deadlock; PostgreSQL ends
    /// one transaction (40P01), and its writer runs the whole of it again once the other committed.
    @Test("a write that loses a deadlock to another node's is run again, whole, and both commit once")
    func deadlockRunsAgain() throws {
        let (a, b) = try twoNodes()
        defer {
            a.close()
            b.close()
        }
        _ = try a.createTasks(sessionID: "s", ["x", "y"].map { makeTask($0, now: SystemClock().now()) })
        let holding = Locked((nodes: Set<String>(), runs: 0))
        /// Raises the priority of `first`, then, once `other` holds its first row, of `second`.
        func job(_ node: String, _ first: String, _ second: String, after other: String)
            -> @Sendable (PostgresTransaction) throws -> Void
        {
            { tx in
                holding.withLockNotifyingAll { $0.runs += 1 }
                try tx.execute("UPDATE tasks SET priority = priority + 0.125 WHERE id = $1", [.text(first)])
                holding.withLockNotifyingAll { _ = $0.nodes.insert(node) }
                holding.wait(until: { $0.nodes.contains(other) }, timeout: 10) { _ in () }
                try tx.execute("UPDATE tasks SET priority = priority + 0.125 WHERE id = $1", [.text(second)])
            }
        }
        let results = Locked<[Result<Void, StoreError>]>([])
        a.submit(job("a", "x", "y", after: "b"), done: { result in results.withLockNotifyingAll { $0.append(result) } })
        b.submit(job("b", "y", "x", after: "a"), done: { result in results.withLockNotifyingAll { $0.append(result) } })
        let both = results.wait(until: { $0.count == 2 }, timeout: 30) { $0 }
        #expect(both.count == 2)
        for result in both { #expect(throws: Never.self) { try result.get() } }
        // One of them ran again (under the full suite's load, more reruns have been seen: five
        // runs in all); each raised both rows once.
        #expect(holding.withLock { $0.runs } >= 3)
        #expect(try a.task(id: "x")?.priority == 0.75 && a.task(id: "y")?.priority == 0.75)
    }

    /// With the database gone, a write gives up once the writer's time to reconnect has passed,
    /// and a read at once: both as `unavailable` (the API's 503 `service_unavailable`), never as a
    /// failure of the database. Both work again once it is back.
    @Test("with the database gone, writes and reads are unavailable, not failed; back, they work again")
    func databaseGone() throws {
        let (a, b) = try twoNodes()
        defer {
            a.close()
            b.close()
        }
        a.writer.reconnectFor = 1
        try server.stop(immediate: true)
        let write: () throws -> Void = { _ = try a.putSession(id: "t", configuration: TransferConfiguration()) }
        let read: () throws -> Void = { _ = try a.task(id: "x") }
        for attempt in [write, read] {
            #expect {
                try attempt()
            } throws: { error in
                guard case StoreError.unavailable = error else { return false }
                return true
            }
        }
        try server.start()
        #expect(try a.putSession(id: "t", configuration: TransferConfiguration()).1)
        #expect(try a.task(id: "x") == nil)
    }

    /// A node stopping while its database is gone: the writer stops trying to reconnect soon after
    /// the stop began, not once its time to reconnect (30 s here, as in the daemon) has passed; the
    /// write it held fails as `unavailable`. Before, a stopping fleet daemon waited those 30 s for
    /// each batch it held.
    @Test("with the database gone, a store closes within seconds; the write it held is unavailable")
    func closeWithDatabaseGone() throws {
        let (a, b) = try twoNodes()
        b.close()
        try server.stop(immediate: true)
        defer { try? server.start() }
        let result = Locked<Result<Void, StoreError>?>(nil)
        let write: (PostgresTransaction) throws -> Void = { tx in
            try tx.execute("UPDATE sessions SET enabled = 0 WHERE id = 's'")
        }
        a.submit(write, done: { outcome in result.withLockNotifyingAll { $0 = outcome } })
        // The writer is in its loop of reconnecting.
        Thread.sleep(forTimeInterval: 0.5)
        #expect(result.withLock { $0 == nil }, "answered before the stop: \(String(describing: result.withLock { $0 }))")
        let started = monotonicSeconds()
        a.close()
        let seconds = monotonicSeconds() - started
        #expect(seconds < 5, "closing took \(seconds) s")
        let outcome = result.wait(until: { $0 != nil }, timeout: 1) { $0 }
        #expect(
            {
                guard case .failure(.unavailable)? = outcome else { return false }
                return true
            }(), "the write's outcome: \(String(describing: outcome))")
    }

    /// The engine's writes (fenced) on a node past its shutdown grace: one the database answers
    /// still commits; with the database gone, one fails `unavailable` within a few seconds, where
    /// it waited for the writer's 30 s of reconnecting (or the lease fence) before.
    @Test("past a stopping node's grace, a fenced write commits while the database answers, and soon fails once it is gone")
    func fencedWritesWhileStopping() throws {
        let (a, b) = try twoNodes()
        defer {
            a.close()
            b.close()
        }
        a.beginStop(within: 0)
        #expect(try a.dueCleanups(now: a.now, limit: 1, excluding: []).isEmpty)
        try server.stop(immediate: true)
        defer { try? server.start() }
        let started = monotonicSeconds()
        #expect {
            _ = try a.dueCleanups(now: a.now, limit: 1, excluding: [])
        } throws: { error in
            guard case StoreError.unavailable = error else { return false }
            return true
        }
        let seconds = monotonicSeconds() - started
        #expect(seconds < 4, "the write waited \(seconds) s")
    }

    /// What a commit announces over NOTIFY, as each node takes it: its sender skips it unparsed;
    /// a queued task reaches the node it is pinned to, or, unpinned, the nodes that see the shared
    /// roots; a list too long for one payload makes the others read everything again.
    @Test("a change message reaches the nodes it concerns: not its sender, a pinned task only its node")
    func changeMessages() throws {
        var changes = StoreChanges()
        let key = Scheduler.Key(session: "s", host: "http://h:80")
        changes.queued = [1, 2, 3].map { Scheduler.Entry(sequence: $0, priority: 0.5, key: key, limit: nil) }
        changes.sessions = ["s"]
        changes.eventsAppended = true
        let pins: [Int64: String] = [1: "a", 2: "b"]
        let messages = ChangeMessage.encode(changes, pins: pins, node: "a")
        #expect(messages.count == 1 && messages[0].hasPrefix("a\n"))
        #expect(ChangeMessage.decode(messages[0], node: "a", runsShared: true) == nil)
        let shared = try #require(ChangeMessage.decode(messages[0], node: "b", runsShared: true))
        #expect(shared.queued.map(\.sequence) == [2, 3])
        #expect(shared.sessions == ["s"] && shared.eventsAppended && !shared.queueReload)
        let own = try #require(ChangeMessage.decode(messages[0], node: "b", runsShared: false))
        #expect(own.queued.map(\.sequence) == [2])
        let other = try #require(ChangeMessage.decode(messages[0], node: "c", runsShared: false))
        #expect(other.queued.isEmpty)
        // Many queued tasks go in several messages; too many changed ones, as a reload.
        changes.queued = (1...100).map { Scheduler.Entry(sequence: $0, priority: 0.5, key: key, limit: nil) }
        let several = ChangeMessage.encode(changes, pins: [:], node: "a")
        #expect(several.count == 3)
        #expect(several.compactMap { ChangeMessage.decode($0, node: "b", runsShared: true) }.flatMap(\.queued).count == 100)
        changes.unqueued = Array(1...2000)
        let reload = try #require(
            ChangeMessage.decode(ChangeMessage.encode(changes, pins: [:], node: "a")[0], node: "b", runsShared: true))
        // A reload is the catch-up of a lost LISTEN: everything is read again, settings included.
        #expect(reload.queueReload && reload.unqueued.isEmpty && reload.eventsAppended)
        #expect(reload.deliveriesAdded && reload.cleanupsAdded && reload.policyReview)
        #expect(several.allSatisfy { $0.utf8.count < 8000 })
    }

    @Test("a wrong password or an unreachable server is a clear refusal to open; a newer schema is refused")
    func opening() throws {
        let badPassword = server.url.replacingOccurrences(of: ":\(server.password)@", with: ":wrong@")
        #expect(badPassword != server.url)
        #expect {
            _ = try PostgresStore(PostgresStore.Options(url: badPassword, node: "a"))
        } throws: { error in
            "\(error)".contains("cannot connect") && "\(error)".contains("password")
        }
        try PostgresSchema.migrate(try PostgresConnection(server.url))
        try PostgresConnection(server.url).execute("INSERT INTO backhaul_schema VALUES (99)")
        #expect {
            _ = try PostgresStore(PostgresStore.Options(url: server.url, node: "a"))
        } throws: { error in
            guard case PostgresStore.OpenFailure.newerSchema(database: 99, _) = error else { return false }
            return true
        }
    }
}
