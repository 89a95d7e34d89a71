import BackhaulCore
import BackhaulQueue
import JSONCodec
import PostgreSQL

/// The engine's side of the store, as `Store+Engine` is for SQLite, with the fleet's rules
/// (docs/fleet.md): a start is a claim (`FOR UPDATE SKIP LOCKED`: a task another node is claiming
/// at that moment is left to it) that takes this node's lease; an attempt's end is written only
/// while this node holds the lease, so a node that lost its task to a takeover cannot overwrite
/// the work of the node that took it.
extension PostgresStore {
    /// Tasks this node may run: pinned here, or not pinned when this node sees the shared roots (a
    /// node given none runs only the tasks it accepted itself).
    var runsHere: String {
        options.sharedRoots.isEmpty ? "pinned_node = $2" : "(pinned_node IS NULL OR pinned_node = $2)"
    }

    /// At start: this node's tasks left `running` by its stop or crash go back to the queue, their
    /// attempt counted (other nodes' running tasks are theirs, and their leases say when not).
    public func recoverInterrupted() throws(StoreError) -> (requeued: Int, failed: [String]) {
        let now = self.now
        return try write { [self] tx in
            let (running, failed) = try PostgresTaskRows.decodeEach(
                tx,
                tx.execute(
                    "\(PostgresTaskRows.select) WHERE state = 'running' AND lease_node = $1 ORDER BY seq FOR UPDATE",
                    [.text(node)]), now: now)
            for task in running { try transition(tx, task, .requeued(counted: true), now: now, lease: .release) }
            return (running.count, failed)
        }
    }

    public func queuedEntries(after sequence: Int64, limit: Int) throws(StoreError) -> [Scheduler.Entry] {
        try read { tx in
            try tx.rows(
                """
                SELECT seq, priority, session_id, host_key,
                    CASE WHEN configuration = '{}' THEN NULL
                        ELSE (configuration::jsonb ->> 'max_connections_per_host')::bigint END
                FROM tasks WHERE state = 'queued' AND waiting_reason IS NULL AND seq > $1 AND \(runsHere)
                ORDER BY seq LIMIT $3
                """, [.int(sequence), .text(node), .int(limit)], StoreRules.queueEntry)
        }
    }

    public func task(sequence: Int64) throws(StoreError) -> TaskRecord? {
        try read { tx in try PostgresTaskRows.fetch(tx, sequence: sequence, lock: false) }
    }

    /// Claims the task for its next attempt if it is still queued and may run here, and is not
    /// being claimed by another node at this moment (`SKIP LOCKED`). The engine's copy is written
    /// back when the row is still at its revision, in one round trip; otherwise the row is read
    /// again, locked, and the claim decided on what it holds now. The claim waits for the server's
    /// disk (`durable`): the engine sends bytes once it returns, and a claim a crash of the server
    /// lost would leave the task queued for another node to send at the same time.
    public func startAttempt(_ task: TaskRecord, done: @escaping @Sendable (Result<TaskRecord?, StoreError>) -> Void) {
        let now = self.now
        submit(
            durable: true,
            { [self] tx -> TaskRecord? in
                // Only a row still queued here is locked: a node whose copy is stale must not hold
                // the row of a task another node runs (its end would wait for this transaction).
                let claimable =
                    "seq = (SELECT seq FROM tasks WHERE seq = $1 AND state = 'queued' AND \(runsHere) FOR UPDATE SKIP LOCKED)"
                let leaseSeconds = options.leaseSeconds
                if let written = try move(
                    tx, task, .attemptStarted, now: now,
                    writing: { started in
                        try PostgresTaskRows.update(
                            tx, from: task, to: started, onlyIf: claimable, whileAtRevision: true, lease: .take,
                            leaseSeconds: leaseSeconds)
                    })
                {
                    return written
                }
                guard
                    let current = try tx.first(
                        "\(PostgresTaskRows.select) WHERE seq = $1 AND state = 'queued' AND \(runsHere) FOR UPDATE SKIP LOCKED",
                        [.int(task.sequence), .text(node)], PostgresTaskRows.decode)
                else { return nil }
                return try move(tx, current, .attemptStarted, now: now) { started in
                    try PostgresTaskRows.update(
                        tx, from: current, to: started, onlyIf: "state = 'queued'", lease: .take, leaseSeconds: leaseSeconds)
                }
            }, done: done)
    }

    /// Records how this node's attempt ended, while this node still holds the task's lease; nil
    /// when the task left that attempt meanwhile (a client's change, a takeover). As a start does,
    /// it writes the engine's copy back when the row is still at its revision (a checkpoint saved
    /// during the attempt counts as a change), and reads the row again otherwise.
    public func finishAttempt(
        _ task: TaskRecord, bytesTransferred: Int64, end: AttemptEnd, history: AttemptRecord,
        done: @escaping @Sendable (Result<TaskRecord?, StoreError>) -> Void
    ) {
        let now = self.now
        let entry = history.ended(by: end)
        submit(
            { [self, entry] tx -> TaskRecord? in
                let ended = TaskInput.attemptEnded(attempt: task.attempts, bytesTransferred: bytesTransferred, end)
                if let written = try move(
                    tx, task, ended, now: now,
                    writing: { next in
                        try PostgresTaskRows.update(
                            tx, from: task, to: next, onlyIf: "state = 'running' AND lease_node = $2", whileAtRevision: true,
                            lease: .release, attempt: entry)
                    })
                {
                    return written
                }
                guard
                    let current = try tx.first(
                        "\(PostgresTaskRows.select) WHERE seq = $1 AND state = 'running' AND attempts = $3 AND lease_node = $2 FOR UPDATE",
                        [.int(task.sequence), .text(node), .int(task.attempts)], PostgresTaskRows.decode)
                else { return nil }
                return try move(tx, current, ended, now: now) { next in
                    try PostgresTaskRows.update(tx, from: current, to: next, lease: .release, attempt: entry)
                }
            }, done: done)
    }

    /// This node's tasks shown running that its engine does not run go back to the queue, their
    /// attempt not counted.
    public func requeueRunning(except running: Set<String>, done: @escaping @Sendable (Result<Int, StoreError>) -> Void) {
        let now = self.now
        submit(
            { [self] tx -> Int in
                let orphans = try tx.rows(
                    "\(PostgresTaskRows.select) WHERE state = 'running' AND lease_node = $1 FOR UPDATE", [.text(node)],
                    PostgresTaskRows.decode
                ).filter { !running.contains($0.id) }
                for task in orphans { try transition(tx, task, .requeued(counted: false), now: now, lease: .release) }
                return orphans.count
            }, done: done)
    }

    /// Moves tasks whose timers have passed, as `Store.fireTimers` does. Any node may: a row
    /// another node is moving at that moment is left to it.
    public func fireTimers(
        now: Timestamp, done: @escaping @Sendable (Result<(expired: Int, next: Timestamp?), StoreError>) -> Void
    ) {
        submit(
            { [self] tx -> (expired: Int, next: Timestamp?) in
                let due: [(TaskRecord, TaskInput)] =
                    try tx.rows(
                        "\(PostgresTaskRows.select) WHERE state = 'retrying' AND next_attempt_at <= $1 FOR UPDATE SKIP LOCKED",
                        [.double(now)], PostgresTaskRows.decode
                    ).map { ($0, .retryDue) }
                    + tx.rows(
                        """
                        \(PostgresTaskRows.select) WHERE state = 'waiting' AND waiting_reason = 'scheduled'
                            AND earliest_begin_at <= $1 FOR UPDATE SKIP LOCKED
                        """, [.double(now)], PostgresTaskRows.decode
                    ).map { ($0, .scheduledDue) }
                for (task, input) in due {
                    if case .success(let next) = task.applying(input, now: now) { try save(tx, from: task, to: next, now: now) }
                }
                let expired = try tx.rows(
                    "\(PostgresTaskRows.select) WHERE deadline_at <= $1 AND finished_at IS NULL FOR UPDATE SKIP LOCKED",
                    [.double(now)], PostgresTaskRows.decode)
                var count = 0
                for task in expired {
                    guard case .success(let next) = task.applying(.deadlinePassed, now: now) else { continue }
                    try save(tx, from: task, to: next, now: now, lease: task.state == .running ? .release : .keep)
                    count += 1
                }
                return (count, try nextTimer(tx))
            }, done: done)
    }

    public func nextTimer() throws(StoreError) -> Timestamp? {
        try read { tx in try nextTimer(tx) }
    }

    func nextTimer(_ tx: PostgresTransaction) throws -> Timestamp? {
        try tx.first(
            """
            SELECT LEAST(
                (SELECT min(next_attempt_at) FROM tasks WHERE state = 'retrying'),
                (SELECT min(earliest_begin_at) FROM tasks WHERE state = 'waiting' AND waiting_reason = 'scheduled'),
                (SELECT min(deadline_at) FROM tasks WHERE finished_at IS NULL))
            """
        ) { $0.optionalDouble(0) } ?? nil
    }

    /// Tasks the policy holds that this node may run. Each node decides by its own network: a task
    /// held here may be claimed by a node whose network allows it.
    public func policyHeldTasks(afterSequence: Int64, limit: Int) throws(StoreError) -> [HeldTask] {
        let reasons = Policy.reasons.map(\.rawValue).sorted()
        return try read { tx in
            try tx.rows(
                """
                SELECT seq, id, session_id, configuration, waiting_reason FROM tasks
                WHERE state = 'waiting' AND waiting_reason = ANY($3::text[]) AND seq > $1 AND \(runsHere)
                ORDER BY seq LIMIT $4
                """, [.int(afterSequence), .text(node), .array(reasons), .int(limit)], StoreRules.heldTask)
        }
    }
}
