import PostgreSQL

/// The PostgreSQL state's schema and its migrations (docs/fleet.md). Every node that starts runs
/// `migrate`: under an advisory lock, so that of several nodes starting at once one migrates and
/// the others find the work done; a database whose schema is newer than this code knows is
/// refused, as an older node must not write rows it does not understand.
public enum PostgresSchema {
    /// The advisory lock's key: "backhaul" in ASCII, as a 64-bit number.
    static let lockKey: Int64 = 0x6261_636B_6861_756C

    /// Each migration, in order; the schema's version is how many have run.
    static let migrations: [String] = [
        """
        CREATE TABLE nodes (
            id text PRIMARY KEY,
            version text NOT NULL,
            started_at timestamptz NOT NULL,
            last_heartbeat_at timestamptz NOT NULL,
            running integer NOT NULL DEFAULT 0,
            network jsonb
        );
        CREATE TABLE tasks (
            seq bigserial PRIMARY KEY,
            id text NOT NULL UNIQUE,
            session_id text NOT NULL,
            state text NOT NULL,
            waiting_reason text,
            priority double precision NOT NULL DEFAULT 0.5,
            pinned_node text,
            lease_node text,
            lease_expires_at timestamptz,
            record jsonb NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp()
        );
        CREATE INDEX tasks_claimable ON tasks (priority DESC, seq) WHERE state = 'queued';
        CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE state = 'running';
        CREATE INDEX tasks_pinned ON tasks (pinned_node) WHERE pinned_node IS NOT NULL;
        """
    ]

    /// The version this code writes.
    public static var currentVersion: Int { migrations.count }

    public enum Failure: Error, Equatable, CustomStringConvertible {
        /// The database was migrated by a newer version of the daemon.
        case newerSchema(database: Int, known: Int)

        public var description: String {
            switch self {
            case .newerSchema(let database, let known):
                "the database's schema is version \(database), newer than this daemon knows (\(known)): upgrade this node"
            }
        }
    }

    /// Brings the schema to `currentVersion` (or the first `upTo` migrations, for tests of an
    /// older node); the version found before.
    @discardableResult
    public static func migrate(_ db: PostgresConnection, upTo known: Int? = nil) throws -> Int {
        let known = min(known ?? currentVersion, currentVersion)
        try db.execute("SELECT pg_advisory_lock($1)", [.int(lockKey)])
        defer { _ = try? db.execute("SELECT pg_advisory_unlock($1)", [.int(lockKey)]) }
        try db.execute("CREATE TABLE IF NOT EXISTS backhaul_schema (version integer NOT NULL)")
        let found = Int(try db.execute("SELECT max(version) FROM backhaul_schema").int(0, 0) ?? 0)
        guard found <= known else { throw Failure.newerSchema(database: found, known: known) }
        for version in found..<known {
            try db.transaction {
                try db.executeScript(migrations[version])
                try db.execute("INSERT INTO backhaul_schema VALUES ($1)", [.int(Int64(version + 1))])
            }
        }
        return found
    }
}
