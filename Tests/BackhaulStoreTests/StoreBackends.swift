import BackhaulCore
import BackhaulPostgres
import BackhaulTesting
import PostgreSQL
import Testing
import Threads

@testable import BackhaulQueue
@testable import BackhaulSQLite

/// The two implementations of `StateStore` the store's tests run against (docs/fleet.md): what holds
/// of the state through the interface holds of both.
enum Backend: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case sqlite
    case postgres

    var testDescription: String { rawValue }

    /// A new, empty store on `clock`: SQLite in memory, or PostgreSQL in a database of its own on
    /// the test process's server, so that tests running side by side never see each other's rows.
    func open(clock: any Clock = SystemClock()) throws -> any StateStore {
        switch self {
        case .sqlite: return try Store(path: ":memory:", clock: clock)
        case .postgres:
            var options = PostgresStore.Options(url: try TestPostgres.newDatabase(), node: "a")
            options.readers = 2
            return try PostgresStore(options, clock: clock)
        }
    }

    /// A new store, as `open`, with the session "s" the tests put their tasks in.
    func openWithSession(clock: any Clock = SystemClock()) throws -> any StateStore {
        let store = try open(clock: clock)
        _ = try store.putSession(id: "s", configuration: TransferConfiguration())
        return store
    }
}

/// The one PostgreSQL server of the test process, started by the first test that needs it. Its
/// watchdog stops it when the process ends, however it ends (`PostgresServer`).
enum TestPostgres {
    private static let server = Locked<Result<PostgresServer, any Error>?>(nil)
    private static let databases = Locked(0)

    /// The URL of a new database (`t_<n>`) that the role `backhaul` owns. The role is the
    /// cluster's bootstrap superuser (`initdb -U backhaul`), so it may create databases.
    static func newDatabase() throws -> String {
        let started = try server.withLock { server in
            let result = server ?? Result { try PostgresServer() }
            server = result
            return result
        }.get()
        let number = databases.withLock { count in
            count += 1
            return count
        }
        let name = "t_\(number)"
        let base = "postgres://backhaul:\(started.password)@127.0.0.1:\(started.port)/"
        _ = try PostgresConnection(base + "postgres").execute("CREATE DATABASE \(name) OWNER backhaul")
        return base + name
    }
}

extension StateStore {
    /// Runs `sql` on the store's database behind the store's back, as a row left by another build
    /// would be there: through the SQLite writer, or on a connection of its own to PostgreSQL.
    func plant(_ sql: String) throws {
        switch self {
        case let store as Store: try store.write { db in try db.run(sql) }
        case let store as PostgresStore: _ = try PostgresConnection(store.options.url).execute(sql)
        default: Issue.record("no way to plant rows in \(type(of: self))")
        }
    }
}
