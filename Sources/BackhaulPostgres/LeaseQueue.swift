import PostgreSQL

/// One node's view of the fleet's shared task queue in PostgreSQL (docs/fleet.md): tasks are
/// claimed with `FOR UPDATE SKIP LOCKED`, held by a lease that the node's heartbeat renews, and
/// taken over by another node once a lease has run out. Every time is the database's
/// (`clock_timestamp()`), so the nodes' clocks need not agree.
///
/// - A task pinned to a node (its file is on that node's own disk) is claimed by that node only.
///   When that node's lease runs out its tasks wait with `node_unavailable` instead of being taken
///   over, and they are queued again when the node registers.
/// - A lease is the fence: only the node holding a task's lease can end it (`finish`), so a node
///   that lost its lease (killed, partitioned, paused) cannot overwrite the work of the node that
///   took the task over.
///
/// Owned by one thread with its own connection, like the SQLite store's writer.
public final class LeaseQueue {
    /// A claimed task: its id and its stored record (JSON text).
    public struct Claim: Equatable, Sendable {
        public var id: String
        public var record: String
    }

    /// The node's lease on a task is gone: another node may hold it now.
    public struct LeaseLost: Error, Equatable {
        public var taskID: String
        public init(taskID: String) { self.taskID = taskID }
    }

    /// The channel on which a task that became claimable is announced (its id is the payload).
    public static let channel = "backhaul_queue"

    public let node: String
    public let leaseSeconds: Double
    private let db: PostgresConnection

    public init(db: PostgresConnection, node: String, leaseSeconds: Double) {
        self.db = db
        self.node = node
        self.leaseSeconds = leaseSeconds
    }

    /// Records the node as started (or started again): its own running tasks are interrupted
    /// attempts, queued again as after a restart, and its pinned tasks that waited for it are queued.
    public func register(version: String) throws {
        try db.transaction {
            try db.execute(
                """
                INSERT INTO nodes (id, version, started_at, last_heartbeat_at) VALUES ($1, $2, clock_timestamp(), clock_timestamp())
                ON CONFLICT (id) DO UPDATE SET version = $2, started_at = clock_timestamp(),
                    last_heartbeat_at = clock_timestamp(), running = 0
                """, [.text(node), .text(version)])
            let released = try db.execute(
                """
                UPDATE tasks SET state = 'queued', waiting_reason = NULL, lease_node = NULL, lease_expires_at = NULL
                WHERE (state = 'running' AND lease_node = $1)
                   OR (state = 'waiting' AND waiting_reason = 'node_unavailable' AND pinned_node = $1)
                """, [.text(node)])
            if released.affected > 0 { try db.notify(Self.channel, payload: "") }
        }
    }

    /// Adds a task, queued (pinned to this node when `pinned`), and announces it.
    public func enqueue(id: String, session: String, priority: Double = 0.5, pinned: Bool, record: String) throws {
        try db.transaction {
            try db.execute(
                """
                INSERT INTO tasks (id, session_id, state, priority, pinned_node, record)
                VALUES ($1, $2, 'queued', $3, $4, $5::jsonb)
                """, [.text(id), .text(session), .double(priority), pinned ? .text(node) : .null, .text(record)])
            try db.notify(Self.channel, payload: id)
        }
    }

    /// Claims up to `limit` queued tasks this node may run, highest priority first, each under a
    /// lease of `leaseSeconds`. Tasks other nodes are claiming at the same moment are skipped, not
    /// waited for.
    public func claim(limit: Int) throws -> [Claim] {
        let rows = try db.execute(
            """
            UPDATE tasks SET state = 'running', lease_node = $1,
                lease_expires_at = clock_timestamp() + make_interval(secs => $2)
            WHERE seq IN (
                SELECT seq FROM tasks
                WHERE state = 'queued' AND (pinned_node IS NULL OR pinned_node = $1)
                ORDER BY priority DESC, seq
                LIMIT $3
                FOR UPDATE SKIP LOCKED)
            RETURNING id, record::text
            """, [.text(node), .double(leaseSeconds), .int(Int64(limit))])
        return (0..<rows.count).compactMap { row in
            rows.string(row, 0).map { Claim(id: $0, record: rows.string(row, 1) ?? "{}") }
        }
    }

    /// The heartbeat: the node is alive, `running` transfers; every lease it still holds is
    /// extended. Returns the tasks whose leases it holds; a task the node runs and that is not
    /// among them was taken from it, and its transfer must stop at once.
    public func heartbeat(running: Int) throws -> Set<String> {
        try db.transaction {
            try db.execute(
                "UPDATE nodes SET last_heartbeat_at = clock_timestamp(), running = $2 WHERE id = $1",
                [.text(node), .int(Int64(running))])
            let rows = try db.execute(
                """
                UPDATE tasks SET lease_expires_at = clock_timestamp() + make_interval(secs => $2)
                WHERE state = 'running' AND lease_node = $1 AND lease_expires_at > clock_timestamp()
                RETURNING id
                """, [.text(node), .double(leaseSeconds)])
            return Set((0..<rows.count).compactMap { rows.string($0, 0) })
        }
    }

    /// Ends the attempt of a task this node holds: `state` and `record` as the attempt left them
    /// (`queued` gives the task back). Throws `LeaseLost` when the lease is no longer this node's,
    /// and then changes nothing.
    public func finish(_ id: String, state: String, record: String) throws {
        try db.transaction {
            let updated = try db.execute(
                """
                UPDATE tasks SET state = $3, record = $4::jsonb, lease_node = NULL, lease_expires_at = NULL
                WHERE id = $1 AND state = 'running' AND lease_node = $2 AND lease_expires_at > clock_timestamp()
                """, [.text(id), .text(node), .text(state), .text(record)])
            guard updated.affected == 1 else { throw LeaseLost(taskID: id) }
            if state == "queued" { try db.notify(Self.channel, payload: id) }
        }
    }

    /// Takes over what nodes that stopped renewing left: a task whose lease ran out goes back to the
    /// queue (any node resumes it, as after a restart), unless it is pinned, when it waits for its
    /// node with `node_unavailable`. Queued tasks pinned to a node whose heartbeat is older than a
    /// lease wait the same way. Returns how many tasks were taken over and how many wait.
    @discardableResult
    public func takeOver() throws -> (requeued: Int, waiting: Int) {
        try db.transaction {
            let requeued = try db.execute(
                """
                UPDATE tasks SET state = 'queued', lease_node = NULL, lease_expires_at = NULL
                WHERE state = 'running' AND lease_expires_at <= clock_timestamp() AND pinned_node IS NULL
                """)
            let waiting = try db.execute(
                """
                UPDATE tasks SET state = 'waiting', waiting_reason = 'node_unavailable', lease_node = NULL,
                    lease_expires_at = NULL
                WHERE pinned_node IS NOT NULL AND (
                    (state = 'running' AND lease_expires_at <= clock_timestamp())
                    OR (state = 'queued' AND pinned_node IN (
                        SELECT id FROM nodes
                        WHERE last_heartbeat_at <= clock_timestamp() - make_interval(secs => $1))))
                """, [.double(leaseSeconds)])
            if requeued.affected > 0 { try db.notify(Self.channel, payload: "") }
            return (requeued.affected, waiting.affected)
        }
    }

    /// The nodes as the fleet knows them: id, version, running, seconds since the last heartbeat.
    public func nodes() throws -> [(id: String, version: String, running: Int, silentSeconds: Double)] {
        let rows = try db.execute(
            """
            SELECT id, version, running, extract(epoch FROM clock_timestamp() - last_heartbeat_at)::float8
            FROM nodes ORDER BY id
            """)
        return (0..<rows.count).map { row in
            (rows.string(row, 0) ?? "", rows.string(row, 1) ?? "", Int(rows.int(row, 2) ?? 0), rows.double(row, 3) ?? 0)
        }
    }
}
