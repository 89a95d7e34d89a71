import BackhaulCore
import BackhaulPostgres
import BackhaulStore
import BackhaulTesting
import Foundation
import PostgreSQL
import Testing
import Threads

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
