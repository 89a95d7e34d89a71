import PostgreSQL

/// The PostgreSQL state's schema and its migrations (docs/fleet.md). Every node that starts runs
/// `migrate`: under an advisory lock, so that of several nodes starting at once one migrates and
/// the others find the work done; a database whose schema is newer than this code knows is
/// refused, as an older node must not write rows it does not understand.
public enum PostgresSchema {
    /// The advisory lock's key: "backhaul" in ASCII, as a 64-bit number.
    static let lockKey: Int64 = 0x6261_636B_6861_756C

    /// Each migration, in order; the schema's version is how many have run.
    /// The tables are the SQLite store's (`BackhaulSQLite/Schema.swift`), column for column, so that
    /// both read and write a task's columns with the same code (`TaskRows`), with what the fleet
    /// adds: the nodes, a task's pin and lease, and the claims of deliveries and cleanups. Times are
    /// the daemon's clock (seconds since 1970, as in SQLite), except leases and heartbeats, which
    /// are the database's (`clock_timestamp()`), so that the nodes' clocks need not agree.
    static let migrations: [String] = [
        """
        CREATE TABLE nodes (
            id text PRIMARY KEY,
            version text NOT NULL,
            started_at double precision NOT NULL,
            last_heartbeat_at timestamptz NOT NULL,
            running integer NOT NULL DEFAULT 0,
            network text
        );
        CREATE TABLE sessions (
            id text PRIMARY KEY,
            configuration text NOT NULL,
            enabled integer NOT NULL DEFAULT 1,
            lifecycle text NOT NULL DEFAULT 'active',
            created_at double precision NOT NULL,
            open_tasks bigint NOT NULL DEFAULT 0
        );
        CREATE TABLE tasks (
            seq bigserial PRIMARY KEY,
            id text NOT NULL UNIQUE,
            session_id text NOT NULL,
            kind text NOT NULL,
            state text NOT NULL,
            waiting_reason text,
            file_path text NOT NULL,
            file_size bigint NOT NULL,
            file_mtime_ns bigint NOT NULL,
            request text NOT NULL,
            upload text NOT NULL,
            host_key text NOT NULL,
            priority double precision NOT NULL,
            description text,
            idempotency_key text,
            delete_file_on_success integer NOT NULL DEFAULT 0,
            configuration text NOT NULL,
            attempts integer NOT NULL DEFAULT 0,
            bytes_sent bigint NOT NULL DEFAULT 0,
            created_at double precision NOT NULL,
            started_at double precision,
            finished_at double precision,
            next_attempt_at double precision,
            earliest_begin_at double precision,
            deadline_at double precision NOT NULL,
            response text,
            error text,
            cancellation integer,
            checkpoint text,
            download text,
            detached_from text,
            last_error text,
            pinned_node text,
            lease_node text,
            lease_expires_at timestamptz
        );
        CREATE UNIQUE INDEX tasks_idempotency ON tasks (session_id, idempotency_key)
            WHERE idempotency_key IS NOT NULL AND detached_from IS NULL;
        CREATE INDEX tasks_by_session ON tasks (session_id, seq);
        CREATE INDEX tasks_open ON tasks (session_id, state) WHERE finished_at IS NULL;
        CREATE INDEX tasks_held ON tasks (state, waiting_reason, seq) WHERE state = 'queued' OR state = 'waiting';
        CREATE INDEX tasks_retries ON tasks (next_attempt_at) WHERE state = 'retrying';
        CREATE INDEX tasks_deadlines ON tasks (deadline_at) WHERE finished_at IS NULL;
        CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL;
        CREATE INDEX tasks_leased ON tasks (lease_node, lease_expires_at) WHERE state = 'running';
        CREATE INDEX tasks_pinned ON tasks (pinned_node, state) WHERE pinned_node IS NOT NULL;
        CREATE TABLE attempts (
            task_seq bigint NOT NULL REFERENCES tasks (seq) ON DELETE CASCADE,
            number integer NOT NULL,
            started_at double precision NOT NULL,
            ended_at double precision NOT NULL,
            bytes_sent bigint NOT NULL,
            bytes_received bigint NOT NULL,
            outcome text NOT NULL,
            http_status integer,
            error text,
            network_type text,
            PRIMARY KEY (task_seq, number)
        );
        CREATE TABLE events (
            seq bigserial PRIMARY KEY,
            id text NOT NULL,
            type text NOT NULL,
            session_id text NOT NULL,
            task_id text,
            created_at double precision NOT NULL,
            data text NOT NULL
        );
        CREATE INDEX events_by_session ON events (session_id, seq);
        CREATE INDEX events_by_task ON events (task_id) WHERE task_id IS NOT NULL;
        CREATE TABLE webhooks (
            id text PRIMARY KEY,
            session_id text NOT NULL,
            url text NOT NULL,
            events text NOT NULL,
            secret text NOT NULL,
            previous_secret text,
            previous_secret_expires_at double precision,
            enabled integer NOT NULL DEFAULT 1,
            disabled_reason text,
            created_at double precision NOT NULL
        );
        CREATE INDEX webhooks_by_session ON webhooks (session_id);
        CREATE TABLE deliveries (
            seq bigserial PRIMARY KEY,
            webhook_id text NOT NULL,
            event_seq bigint NOT NULL,
            event_type text NOT NULL,
            state text NOT NULL,
            attempts integer NOT NULL DEFAULT 0,
            next_attempt_at double precision,
            last_status integer,
            last_error text,
            history text NOT NULL DEFAULT '[]',
            created_at double precision NOT NULL,
            finished_at double precision,
            claimed_by text,
            claim_expires_at timestamptz
        );
        CREATE INDEX deliveries_due ON deliveries (state, next_attempt_at);
        CREATE INDEX deliveries_by_webhook ON deliveries (webhook_id, seq);
        CREATE INDEX deliveries_by_event ON deliveries (event_seq);
        CREATE TABLE cleanups (
            seq bigserial PRIMARY KEY,
            task_id text NOT NULL,
            request text NOT NULL,
            attempts integer NOT NULL DEFAULT 0,
            next_attempt_at double precision NOT NULL,
            created_at double precision NOT NULL,
            claimed_by text,
            claim_expires_at timestamptz
        );
        CREATE INDEX cleanups_due ON cleanups (next_attempt_at);
        CREATE TABLE settings (
            key text PRIMARY KEY,
            value text NOT NULL
        );
        CREATE TABLE budget_usage (
            day text NOT NULL,
            network_type text NOT NULL,
            bytes bigint NOT NULL,
            PRIMARY KEY (day, network_type)
        );
        """,
        // A task's revision: a node writes its copy of a task back only while the row is still
        // at the copy's revision (docs/fleet.md). The database counts it, so that every write
        // counts, also one by a node of an older version or by hand: any update that sets a
        // column of the task's record (not a lease's renewal, which sets only the lease).
        """
        ALTER TABLE tasks ADD COLUMN revision bigint NOT NULL DEFAULT 0;
        CREATE FUNCTION tasks_count_revision() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.revision := OLD.revision + 1;
            RETURN NEW;
        END
        $$;
        CREATE TRIGGER tasks_revision BEFORE UPDATE OF seq, id, session_id, kind, state, waiting_reason, file_path,
            file_size, file_mtime_ns, request, upload, host_key, priority, description, idempotency_key,
            delete_file_on_success, configuration, attempts, bytes_sent, created_at, started_at, finished_at,
            next_attempt_at, earliest_begin_at, deadline_at, response, error, cancellation, checkpoint, download,
            detached_from, last_error, pinned_node
            ON tasks FOR EACH ROW EXECUTE FUNCTION tasks_count_revision();
        """,
        // The token of each node's last write transaction, written in it: after a connection lost
        // during its COMMIT, the writer reads it back to learn whether it committed (`PostgresWriter`).
        """
        CREATE TABLE writer_commits (
            node text PRIMARY KEY,
            token bigint NOT NULL
        );
        """,
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
