/// One step of a schema: SQL run in its own transaction, or outside any (`VACUUM` and the
/// `auto_vacuum` switch only run there).
public struct Migration: Sendable {
    public var version: Int
    public var sql: String
    public var transactional: Bool

    public init(_ version: Int, _ sql: String, transactional: Bool = true) {
        self.version = version
        self.sql = sql
        self.transactional = transactional
    }
}

/// Applies numbered migrations in order, tracked in `PRAGMA user_version`, each in a transaction.
public struct Migrator {
    public var migrations: [Migration]

    public init(migrations: [Migration]) { self.migrations = migrations.sorted { $0.version < $1.version } }

    /// The newest version these migrations reach.
    public var latest: Int { migrations.last?.version ?? 0 }

    /// The database's version (`PRAGMA user_version`).
    public func version(_ connection: Connection) throws -> Int {
        try connection.queryFirst("PRAGMA user_version") { Int($0.int(0)) } ?? 0
    }

    public func migrate(_ connection: Connection) throws {
        let current = try version(connection)
        for migration in migrations where migration.version > current {
            if migration.transactional {
                try connection.transaction {
                    try connection.execute(migration.sql)
                    try connection.execute("PRAGMA user_version = \(migration.version)")
                }
            } else {
                try connection.execute(migration.sql)
                try connection.execute("PRAGMA user_version = \(migration.version)")
            }
        }
    }
}
