import BackhaulCore
import BackhaulQueue
import JSONCodec
import PostgreSQL

/// The fleet's leases (docs/fleet.md). A node's heartbeat, on a thread and a connection of its own,
/// beats every third of a lease: it renews the leases of the tasks it runs, reports what it lost,
/// and takes over what silent nodes left. Every lease time is the database's.
extension PostgresStore {
    /// Records the node as started: the pinned tasks that waited for it are queued again (its own
    /// interrupted attempts are `recoverInterrupted`'s, at the engine's start).
    func register() throws {
        let now = self.now
        try write { [self] tx in
            try tx.execute(
                """
                INSERT INTO nodes (id, version, started_at, last_heartbeat_at) VALUES ($1, $2, $3, clock_timestamp())
                ON CONFLICT (id) DO UPDATE SET version = $2, started_at = $3, last_heartbeat_at = clock_timestamp(),
                    running = 0
                """, [.text(node), .text(options.version), .double(now)])
            let waiting = try tx.rows(
                """
                \(PostgresTaskRows.select) WHERE state = 'waiting' AND waiting_reason = 'node_unavailable' AND pinned_node = $1
                ORDER BY seq FOR UPDATE
                """, [.text(node)], PostgresTaskRows.decode)
            for task in waiting {
                var next = task
                next.state = .queued
                next.waitingReason = nil
                try save(tx, from: task, to: next, now: now)
            }
        }
    }

    /// The heartbeat's loop, until the store closes. Each beat's send time moves the fence's
    /// deadline once the database answered it; a beat answered after that deadline passed finds
    /// the transfers already stopped by the fence, so every lease it held is let go (runs out and
    /// is taken over), and the engine hears to look at its queue again.
    func beatUntilStopped() {
        let interval = max(0.05, options.leaseSeconds / 3)
        var connection: PostgresConnection?
        repeat {
            let sentAt = monotonicSeconds()
            do {
                if connection == nil {
                    connection = try PostgresConnection(
                        options.url, connectTimeout: 5, deadline: options.leaseSeconds, name: "backhauld heartbeat")
                }
                try beat(connection!)
                health.withLock {
                    $0.lastBeat = sentAt
                    $0.lastError = nil
                }
                if fence.beatAnswered(sentAt: sentAt).lapsedBeforeAnswer { resumeAfterLapse() }
                try takeOver()
            } catch {
                if let failure = error as? PostgresError, failure.isConnectionLost || !(connection?.isConnected ?? false) {
                    connection = nil
                }
                let leaseGone = health.withLock { health -> Bool in
                    health.lastError = "\(error)"
                    return monotonicSeconds() - health.lastBeat >= options.leaseSeconds
                }
                // The database has not heard this node for a lease: its leases may be another
                // node's now, and its transfers stop.
                if leaseGone { lose(leased.withLock { $0 }) }
            }
        } while !pause(interval)
    }

    /// The fence stopped this node's transfers while its beats did not get through: every lease it
    /// still holds is let go, and the engine reads its queue again (it starts nothing while the
    /// fence is closed).
    private func resumeAfterLapse() {
        lose(leased.withLock { $0 })
        var changes = StoreChanges()
        changes.queueReload = true
        for observer in observers.withLock({ $0 }) { observer(changes) }
    }

    /// One beat on the heartbeat's own connection: the node's row, and the leases of the tasks this
    /// node runs renewed. A task it runs whose lease is no longer its own was taken over: its
    /// transfer stops now. Only the tasks in `leased` are renewed: a task the database shows leased
    /// here but that this node does not run (its start or end was lost) runs out, and is taken
    /// over like any other.
    private func beat(_ db: PostgresConnection) throws {
        let (running, network) = nodeStatus.withLock { $0 }()
        // Read before the renewal: a lease taken after it began is not missing from what it renews.
        let runningHere = leased.withLock { $0 }
        try db.transaction {
            let updated = try db.execute(
                "UPDATE nodes SET last_heartbeat_at = clock_timestamp(), running = $2, network = $3 WHERE id = $1",
                [.text(node), .int(Int64(running)), network.map { .text($0) } ?? .null])
            if updated.affected == 0 {
                try db.execute(
                    """
                    INSERT INTO nodes (id, version, started_at, last_heartbeat_at, running, network)
                    VALUES ($1, $2, $3, clock_timestamp(), $4, $5)
                    """,
                    [.text(node), .text(options.version), .double(now), .int(Int64(running)), network.map { .text($0) } ?? .null])
            }
            let rows = try db.execute(
                """
                UPDATE tasks SET lease_expires_at = clock_timestamp() + make_interval(secs => $2)
                WHERE state = 'running' AND lease_node = $1 AND lease_expires_at > clock_timestamp() AND id = ANY($3::text[])
                RETURNING id
                """, [.text(node), .double(options.leaseSeconds), .array(runningHere)])
            let held = Set((0..<rows.count).compactMap { rows.string($0, 0) })
            lose(runningHere.subtracting(held))
        }
    }

    /// Stops this node's transfers of `ids`: the observers hear that the tasks left `running`
    /// here (the engine stops them as it does after a client's cancel).
    func lose(_ ids: Set<String>) {
        guard !ids.isEmpty else { return }
        let lost = leased.withLock { leased -> [String] in
            let lost = ids.filter { leased.contains($0) }
            leased.subtract(lost)
            return Array(lost)
        }
        fence.revoke(lost)
        guard !lost.isEmpty else { return }
        var changes = StoreChanges()
        changes.leftRunning = lost.sorted()
        for observer in observers.withLock({ $0 }) { observer(changes) }
    }

    /// Takes over what nodes that stopped renewing left: a running task whose lease ran out goes
    /// back to the queue (its attempt counted, as after a restart), or, pinned to its node, waits
    /// with `node_unavailable`; queued tasks pinned to a node silent for a lease wait the same way.
    /// Rows another node is taking over at that moment are left to it. A row that cannot be read
    /// fails alone (`PostgresTaskRows.failUnreadable`), and is reported (`reportUnreadable`).
    /// Returns how many.
    @discardableResult
    func takeOver() throws(StoreError) -> Int {
        let now = self.now
        let (count, failed) = try write { [self] tx in
            let (expired, failedRunning) = try PostgresTaskRows.decodeEach(
                tx,
                tx.execute(
                    """
                    \(PostgresTaskRows.select) WHERE state = 'running' AND lease_expires_at <= clock_timestamp()
                    ORDER BY seq LIMIT 500 FOR UPDATE SKIP LOCKED
                    """), now: now)
            for task in expired {
                guard case .success(var next) = task.applying(.requeued(counted: true), now: now) else { continue }
                if task.node != nil {
                    next.state = .waiting
                    next.waitingReason = .nodeUnavailable
                }
                try save(tx, from: task, to: next, now: now, lease: .release)
            }
            let (stranded, failedQueued) = try PostgresTaskRows.decodeEach(
                tx,
                tx.execute(
                    """
                    \(PostgresTaskRows.select) WHERE state = 'queued' AND pinned_node IN (SELECT id FROM nodes
                        WHERE last_heartbeat_at <= clock_timestamp() - make_interval(secs => $1))
                    ORDER BY seq LIMIT 500 FOR UPDATE SKIP LOCKED
                    """, [.double(options.leaseSeconds)]), now: now)
            for task in stranded {
                var next = task
                next.state = .waiting
                next.waitingReason = .nodeUnavailable
                try save(tx, from: task, to: next, now: now)
            }
            let failed = failedRunning + failedQueued
            return (expired.count + stranded.count + failed.count, failed)
        }
        if !failed.isEmpty { unreadable.withLock { $0 }(failed) }
        return count
    }

    /// Where the ids of tasks failed because their row cannot be read go (the daemon logs each
    /// at error, naming it); the start's own are `recoverInterrupted`'s answer.
    public func reportUnreadable(_ report: @escaping @Sendable ([String]) -> Void) {
        unreadable.withLock { $0 = report }
    }

    /// The nodes of the fleet, by id.
    public func nodes() throws(StoreError) -> [NodeRecord]? {
        try read { tx in
            try tx.rows(
                """
                SELECT id, version, started_at, extract(epoch FROM last_heartbeat_at)::float8,
                    extract(epoch FROM clock_timestamp() - last_heartbeat_at)::float8, running, network
                FROM nodes ORDER BY id
                """
            ) { row in
                NodeRecord(
                    id: row.string(0), version: row.string(1), startedAt: row.double(2), lastHeartbeatAt: row.double(3),
                    silentSeconds: row.double(4), running: Int(row.int(5)), network: row.optionalString(6))
            }
        }
    }
}
