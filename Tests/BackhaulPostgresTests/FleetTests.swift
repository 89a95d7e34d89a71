import BackhaulCore
import BackhaulStore
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
        let a = try PostgresStore(PostgresStore.Options(url: server.url, node: "a"))
        let b = try PostgresStore(PostgresStore.Options(url: server.url, node: "b"))
        defer {
            a.close()
            b.close()
        }
        b.startFleet()
        _ = try a.putSession(id: "s", configuration: TransferConfiguration())
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

    /// A node claims from the copy its engine kept, which may be stale: the task another node has
    /// started meanwhile. That claim must not lock the row: the running node's end would wait for
    /// the claiming node's whole transaction (and two such nodes deadlock).
    @Test("a claim from a stale copy of a task another node runs leaves its row unlocked; that node's end does not wait")
    func staleClaimLocksNothing() throws {
        // Both see the task's file (a shared root), so either may run it.
        func node(_ id: String) throws -> PostgresStore {
            var options = PostgresStore.Options(url: server.url, node: id)
            options.sharedRoots = ["/d"]
            return try PostgresStore(options)
        }
        let a = try node("a")
        let b = try node("b")
        defer {
            a.close()
            b.close()
        }
        _ = try a.putSession(id: "s", configuration: TransferConfiguration())
        let now = SystemClock().now()
        let task = TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/d/t", size: 10, modifiedAtNanoseconds: 1),
            request: RequestSpec(url: "http://h/t", method: "PUT"), upload: UploadSpec(), createdAt: now,
            deadlineAt: now + 86_400)
        let copy = try a.createTasks(sessionID: "s", [task])[0].0
        let started = try #require(try result { done in b.startAttempt(copy, done: done) })
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

/// Waits for the answer of a write handed over with a callback.
private func result<T: Sendable>(_ start: (@escaping @Sendable (Result<T, StoreError>) -> Void) -> Void) throws -> T {
    let box = Locked<Result<T, StoreError>?>(nil)
    start { answer in box.withLockNotifyingAll { $0 = answer } }
    guard let answer = box.wait(until: { $0 != nil }, timeout: 10, { $0 }) else { throw StoreError.database("no answer in 10 s") }
    return try answer.get()
}
