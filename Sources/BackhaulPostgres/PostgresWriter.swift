import BackhaulCore
import BackhaulQueue
import Glibc
import PostgreSQL
import Threads

/// One node's writer (docs/fleet.md): a thread with its own connection that takes the jobs
/// waiting and runs them in one transaction, each in a savepoint of its own, so that a job that
/// throws undoes only its own part. At the end of the transaction the events go in under the
/// events' advisory lock, and the changes are announced to the other nodes (`NOTIFY`); after the
/// commit the observers hear them and each job's completion runs, in commit order.
///
/// A deadlock or serialization failure (two nodes changing the same rows) runs the whole
/// transaction again; a statement that ran out of time (on a lock a stalled session holds) fails
/// it. The connection gives a call up after a lease, as the node's others do. A connection lost or
/// given up is made anew, with backoff, for up to `reconnectFor` seconds before the jobs fail; once
/// the node stops, until its grace and `stopPatience` more, then once more at most (a stopping
/// node does not wait out a database that is gone: its jobs fail `unavailable`, which the next
/// start or another node's takeover makes good).
///
/// A transaction is run again only when it is known not to have committed: each writes a random
/// token of its own in this node's row of `writer_commits`, and when the connection is lost during
/// its `COMMIT`, the row is read back on a new connection, once the session the transaction ran
/// in is gone (told to end if it is still there: a stopped server process would run the `COMMIT`
/// still in its socket when it runs again).
/// A transaction that committed is settled as committed, and one whose fate stays unknown fails
/// its jobs with `unavailable` (a client's retry with its idempotency keys then finds what
/// committed). The server's transaction ids cannot tell: after a crash of the server, the ids of
/// transactions whose commit was not on disk are given again, to transactions that may commit.
final class PostgresWriter: @unchecked Sendable {
    // @unchecked: `connection` and `afterCommit` are touched on the writer's thread only, after `start`.

    struct Job {
        /// Whether its commit must reach the server's disk before it is answered (a client's
        /// write), or may not wait (the engine's bookkeeping).
        var durable: Bool
        /// The job's work; returns what runs after the commit.
        var body: (PostgresTransaction) throws -> () -> Void
        /// Runs instead when the job failed (its part was rolled back, or the transaction was).
        var failed: (StoreError) -> Void
    }

    /// Its connection's `application_name`.
    static let connectionName = "backhauld writer"
    /// The channel of the changes (`PostgresChangeFeed`).
    static let channel = "backhaul_changes"
    /// The advisory lock that orders the events: "bh-event" in ASCII.
    static let eventsLockKey: Int64 = 0x6268_2D65_7665_6E74

    private var connection: PostgresConnection
    private let url: String
    private let node: String
    /// How long a call of a connection made anew waits for the server (the lease).
    private let callTimeout: Double
    /// Whether a lost connection was tried again once past `giveUpAt` (writer's thread only).
    private var triedPastGiveUp = false
    /// The jobs handed over; once stopping, the time after which a lost connection is no longer
    /// tried again.
    private let queue = Locked<(jobs: [Job], stopping: Bool, giveUpAt: Double)>(([], false, .infinity))
    private let thread = WorkerThread(name: "bh-pg-writer")
    let fileRemover = FileRemoverSlot()
    /// How long a lost connection is tried again before the waiting jobs fail.
    var reconnectFor: Double = 30
    /// How long past a stop's time a lost connection is still tried, and the engine's writes are
    /// still waited for (a server restarting while the node stops; a commit under way).
    var stopPatience: Double = 2
    /// After each commit that changed something: the local observers.
    var afterCommit: (StoreChanges) -> Void = { _ in }
    /// After each commit: the store's own bookkeeping of the transaction (leases).
    var settled: (PostgresTransaction) -> Void = { _ in }
    /// Transactions whose connection was lost during their `COMMIT`, by what the server said of
    /// them afterwards (tests read it).
    let doubts = Locked<(committed: Int, notCommitted: Int, unknown: Int)>((0, 0, 0))

    init(connection: PostgresConnection, url: String, node: String, callTimeout: Double) {
        self.connection = connection
        self.url = url
        self.node = node
        self.callTimeout = callTimeout
    }

    func start() { thread.start { [self] in loop() } }

    /// From when a lost connection is tried again once more at most (infinity until a stop).
    var giveUpAt: Double { queue.withLock { $0.giveUpAt } }

    /// From `time` on, a lost connection is tried again once more at most: the jobs fail
    /// `unavailable`.
    func giveUp(at time: Double) {
        queue.withLockNotifyingAll { $0.giveUpAt = min($0.giveUpAt, time) }
    }

    /// Runs the jobs handed over so far, then stops.
    func stop() {
        giveUp(at: monotonicSeconds() + stopPatience)
        queue.withLockNotifyingAll { $0.stopping = true }
        thread.join()
    }

    func submit(_ job: Job) {
        let accepted = queue.withLockNotifyingAll { queue -> Bool in
            guard !queue.stopping else { return false }
            queue.jobs.append(job)
            return true
        }
        if !accepted { job.failed(.database("the store is closed")) }
    }

    private func loop() {
        while true {
            let (jobs, stopping) = queue.wait(until: { !$0.jobs.isEmpty || $0.stopping }, timeout: 1e9) { queue in
                defer { queue.jobs = [] }
                return (queue.jobs, queue.stopping)
            }
            if !jobs.isEmpty { run(jobs) }
            if stopping, queue.withLock({ $0.jobs.isEmpty }) { return }
        }
    }

    private enum Outcome {
        case done(() -> Void)
        case failed(StoreError)
    }

    /// The connection was lost after the transaction's `COMMIT` may have reached the server.
    /// Thrown and caught on the writer's thread only: its outcomes never cross to another.
    private struct CommitInDoubt: Error, @unchecked Sendable {
        var token: Int64
        var outcomes: [Outcome]
        var cause: PostgresError
        /// The server process of the session it ran in.
        var backend: Int32
    }

    private func run(_ jobs: [Job]) {
        var retries = 0
        // Jobs run one after another in the transaction; when one throws, the transaction is
        // rolled back and run again with a savepoint for each, so that only that one is undone.
        var savepoints = false
        let reconnectUntil = monotonicSeconds() + reconnectFor
        // Read on each try: a stop that comes meanwhile shortens it.
        let deadline = { [self] in min(reconnectUntil, giveUpAt) }
        // Past a stop's time one try more, once for the writer: its connection may have died
        // unseen while the node was idle, with the database well, and a try costs little; a
        // database that is gone costs it once, not every batch of the engine's last writes.
        func mayReconnect() -> Bool {
            let now = monotonicSeconds()
            let giveUpAt = self.giveUpAt
            if now < min(reconnectUntil, giveUpAt) { return true }
            guard now >= giveUpAt, !triedPastGiveUp else { return false }
            triedPastGiveUp = true
            return true
        }
        while true {
            let tx = PostgresTransaction(connection, node: node)
            do {
                guard let outcomes = try transaction(jobs, tx, savepoints: savepoints) else {
                    savepoints = true
                    continue
                }
                return settle(tx, jobs, outcomes)
            } catch let error as PostgresError where error.isRetryable && retries < 20 {
                retries += 1
                usleep(UInt32.random(in: 1_000...(5_000 * UInt32(retries))))
            } catch let error as PostgresError where error.isConnectionLost && mayReconnect() {
                // Lost before its COMMIT was sent: it did not commit. Made anew, with backoff; the
                // whole transaction runs again.
                reconnect(attempt: &retries, until: deadline())
            } catch let doubt as CommitInDoubt {
                switch committed(doubt, until: deadline, attempt: &retries) {
                case true?:
                    doubts.withLock { $0.committed += 1 }
                    // Whether deliveries were added was in the answer that was lost.
                    if !tx.events.isEmpty { tx.changes.deliveriesAdded = true }
                    return settle(tx, jobs, doubt.outcomes)
                case false?:
                    doubts.withLock { $0.notCommitted += 1 }
                case nil:
                    doubts.withLock { $0.unknown += 1 }
                    let failure = StoreError.unavailable(
                        "the connection to the database was lost during a commit, and whether it committed is not known: "
                            + doubt.cause.message)
                    for job in jobs { job.failed(failure) }
                    return
                }
            } catch {
                let failure = StoreError(postgres: error)
                for job in jobs { job.failed(failure) }
                return
            }
        }
    }

    /// A connection made anew (one try), after a pause that grows with `attempt` (kept when it
    /// fails) but does not run past `deadline`.
    private func reconnect(attempt: inout Int, until deadline: Double) {
        let left = deadline - monotonicSeconds()
        let pause = min(2.0, 0.1 * Double(1 << min(attempt, 5)), left)
        if pause > 0 { usleep(UInt32(pause * 1e6)) }
        attempt += 1
        // libpq's least bound is 2 s.
        let connectTimeout = max(2, min(5, Int(left.rounded(.up))))
        let fresh = try? PostgresConnection(
            url, connectTimeout: connectTimeout, deadline: callTimeout, name: Self.connectionName)
        if let fresh { connection = fresh }
    }

    /// Whether the transaction of `doubt`, whose connection was lost or given up during its
    /// `COMMIT`, committed, as this node's row of `writer_commits` says on a new connection: once
    /// the session it ran in is gone. That session may be alive behind a connection given up (a
    /// stopped server process): it is told to end (`pg_terminate_backend`), and until it has, its
    /// socket may still hold the `COMMIT`, which it would run once it runs again, so the row's old
    /// token proves nothing. The row is then read under a share lock, which waits for a
    /// transaction still ending, at most 2 s a try. Tried again until `deadline` (once at least):
    /// nil then.
    private func committed(_ doubt: CommitInDoubt, until deadline: () -> Double, attempt: inout Int) -> Bool? {
        var sessionGone = false
        repeat {
            if !connection.isConnected { reconnect(attempt: &attempt, until: deadline()) }
            if connection.isConnected {
                do {
                    if !sessionGone { sessionGone = try ended(doubt.backend) }
                    if sessionGone {
                        let answers = try connection.pipeline([
                            ("BEGIN", []), ("SET LOCAL lock_timeout TO '2s'", []),
                            ("SELECT token FROM writer_commits WHERE node = $1 FOR SHARE", [.text(node)]), ("COMMIT", []),
                        ])
                        return answers[2].count > 0 && answers[2].int(0, 0) == doubt.token
                    }
                    usleep(50_000)
                } catch {
                    if connection.isConnected { _ = try? connection.execute("ROLLBACK") }
                }
            }
        } while monotonicSeconds() < deadline()
        return nil
    }

    /// Whether the server process `pid` is gone; when it is not, it is told to end. (A pid is
    /// given again only after the kernel's whole range of them went round.)
    private func ended(_ pid: Int32) throws -> Bool {
        guard pid > 0 else { return true }
        let found = try connection.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1::int", [.int(Int64(pid))])
        return found.count == 0
    }

    /// A committed transaction's remaining work, in commit order: its files removed (its commit
    /// was durable, `FileRemovals`), its leases noted, the observers told, each job's completion run.
    private func settle(_ tx: PostgresTransaction, _ jobs: [Job], _ outcomes: [Outcome]) {
        tx.files.remove(through: fileRemover)
        settled(tx)
        if !tx.changes.isEmpty { afterCommit(tx.changes) }
        for (job, outcome) in zip(jobs, outcomes) {
            switch outcome {
            case .done(let finish): finish()
            case .failed(let error): job.failed(error)
            }
        }
    }

    /// One transaction of `jobs`: each job's outcome once it committed; nil when a job threw
    /// without `savepoints` (the transaction was rolled back, to be run again with them). Throws
    /// only what fails the whole of it, and `CommitInDoubt`. A transaction of the engine's writes
    /// alone commits without waiting for the server's disk (`synchronous_commit` off: a crash of
    /// the server may lose its last moments, never leave it inconsistent), as SQLite's relaxed
    /// writes do, unless it has files to remove (`FileRemovals`).
    private func transaction(_ jobs: [Job], _ tx: PostgresTransaction, savepoints: Bool) throws -> [Outcome]? {
        let durable = jobs.contains(where: \.durable)
        tx.begin(durable ? [("BEGIN", [])] : [("BEGIN", []), ("SET LOCAL synchronous_commit TO off", [])])
        do {
            var outcomes: [Outcome] = []
            outcomes.reserveCapacity(jobs.count)
            for job in jobs {
                let mark = tx.mark
                if savepoints { try tx.execute("SAVEPOINT job") }
                do {
                    let finish = try job.body(tx)
                    if savepoints { try tx.execute("RELEASE SAVEPOINT job") }
                    outcomes.append(.done(finish))
                } catch let error as PostgresError where error.isRetryable || error.isConnectionLost || error.isTimeout {
                    // Not one job's fault: a timeout is the database stalled (a lock held by a
                    // stopped session), which every job would meet in turn.
                    throw error
                } catch {
                    tx.rollBack(to: mark)
                    if savepoints {
                        try tx.execute("ROLLBACK TO SAVEPOINT job")
                        outcomes.append(.failed(StoreError(postgres: error)))
                    } else {
                        try tx.rollBackAll()
                        return jobs.count == 1 ? [.failed(StoreError(postgres: error))] : nil
                    }
                }
            }
            let token = Int64.random(in: Int64.min...Int64.max)
            do {
                try commit(tx, token: token, synchronous: !durable && tx.files.needsDurableCommit(durable: durable))
            } catch let error as PostgresError where error.isConnectionLost {
                throw CommitInDoubt(token: token, outcomes: outcomes, cause: error, backend: connection.backendPID)
            } catch let error as PostgresError where !savepoints && !error.isRetryable && !error.isTimeout {
                // Possibly a job's write sent with the commit (`PostgresTransaction.send`). Whose it
                // was shows when the jobs run again in their savepoints, where each one's writes go
                // with its release; a refusal of the commit's own statements fails them all then.
                try tx.rollBackAll()
                return nil
            }
            return outcomes
        } catch {
            if connection.isConnected { try? tx.rollBackAll() }
            throw error
        }
    }

    /// The transaction's last steps, sent together with its COMMIT in one round trip (none needs
    /// another's answer): the sessions' counts of unfinished tasks moved by what it changed; its
    /// events, under the lock that makes their sequence their commit order, each with a delivery
    /// to every enabled subscription of its session that wants it; and its changes announced to
    /// the other nodes (delivered when it commits); and its `token` in this node's row of
    /// `writer_commits`. `synchronous`: a transaction begun without waiting for the disk waits
    /// after all.
    private func commit(_ tx: PostgresTransaction, token: Int64, synchronous: Bool) throws {
        var statements: [(sql: String, parameters: [PostgresValue])] = []
        for (session, delta) in tx.openDeltas.sorted(by: { $0.key < $1.key }) where delta != 0 {
            statements.append(("UPDATE sessions SET open_tasks = open_tasks + $2 WHERE id = $1", [.text(session), .int(delta)]))
        }
        var eventStatements = 0..<0
        if !tx.events.isEmpty {
            statements.append(("SELECT pg_advisory_xact_lock($1)", [.int(Self.eventsLockKey)]))
            let first = statements.count
            for start in stride(from: 0, to: tx.events.count, by: 1000) {
                statements.append(Self.eventInsert(tx.events[start..<min(start + 1000, tx.events.count)]))
            }
            eventStatements = first..<statements.count
            tx.changes.eventsAppended = true
        }
        if !tx.changes.isEmpty {
            // Whether deliveries were added is known only from the answer: the other nodes look.
            var announced = tx.changes
            if !tx.events.isEmpty { announced.deliveriesAdded = true }
            for payload in ChangeMessage.encode(announced, pins: tx.pins, node: node) {
                statements.append(("SELECT pg_notify($1, $2)", [.text(Self.channel), .text(payload)]))
            }
        }
        statements.append(
            (
                "INSERT INTO writer_commits (node, token) VALUES ($1, $2) ON CONFLICT (node) DO UPDATE SET token = excluded.token",
                [.text(node), .int(token)]
            ))
        if synchronous { statements.append(("SET LOCAL synchronous_commit TO on", [])) }
        statements.append(("COMMIT", []))
        // What the jobs left unsent goes first: writes no one waited for are made.
        let answers = try tx.flush(statements)
        let unsent = answers.count - statements.count
        if eventStatements.contains(where: { answers[unsent + $0].affected > 0 }) { tx.changes.deliveriesAdded = true }
    }

    /// Appends `events` and their deliveries in one statement.
    private static func eventInsert(_ events: ArraySlice<PostgresTransaction.PendingEvent>) -> (String, [PostgresValue]) {
        var sql = "WITH e AS (INSERT INTO events (id, type, session_id, task_id, created_at, data) VALUES "
        var values: [PostgresValue] = []
        values.reserveCapacity(events.count * 6)
        for (index, event) in events.enumerated() {
            let base = index * 6
            if index > 0 { sql += ", " }
            sql += "($\(base + 1), $\(base + 2), $\(base + 3), $\(base + 4), $\(base + 5), $\(base + 6))"
            values += [
                .text(RandomID.make(prefix: "msg_", at: event.createdAt)), .text(event.type), .text(event.sessionID),
                .text(event.taskID), .double(event.createdAt), .text(event.data),
            ]
        }
        sql += """
             RETURNING seq, type, session_id, created_at)
            INSERT INTO deliveries (webhook_id, event_seq, event_type, state, next_attempt_at, created_at)
            SELECT w.id, e.seq, e.type, 'pending', e.created_at, e.created_at
            FROM e JOIN webhooks w ON w.session_id = e.session_id AND w.enabled = 1 AND w.events::jsonb ? e.type
            ORDER BY e.seq, w.id
            """
        return (sql, values)
    }
}
