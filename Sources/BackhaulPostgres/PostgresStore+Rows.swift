import BackhaulCore
import BackhaulQueue
import JSONCodec
import PostgreSQL

/// A task's row in PostgreSQL: the SQLite store's columns (read by `TaskRows.decode`), and the
/// fleet's pin and lease. The only code that writes `tasks`, so that every change is noted for the
/// observers (`StoreChanges.note`), as `TaskFeed` does for SQLite.
enum PostgresTaskRows {
    static let select = "SELECT \(TaskRows.columns), pinned_node, revision FROM tasks"

    /// The SQLite store's columns, then the pin (column 31) and the revision (32).
    static func decode(_ row: PostgresRow) throws -> TaskRecord {
        var task = try TaskRows.decode(row)
        task.node = row.optionalString(31)
        task.revision = row.int(32)
        return task
    }

    /// The task as it is, its row locked until the transaction ends (`lock`), so that two nodes
    /// changing one task take turns.
    static func fetch(_ tx: PostgresTransaction, id: String, lock: Bool = true) throws -> TaskRecord? {
        try tx.first("\(select) WHERE id = $1\(lock ? " FOR UPDATE" : "")", [.text(id)], decode)
    }

    static func fetch(_ tx: PostgresTransaction, sequence: Int64, lock: Bool = true) throws -> TaskRecord? {
        try tx.first("\(select) WHERE seq = $1\(lock ? " FOR UPDATE" : "")", [.int(sequence)], decode)
    }

    /// Rows of `select` decoded one by one: a row that cannot be decoded fails alone
    /// (`failUnreadable`) instead of failing the write that met it. The decoded tasks, and the ids
    /// of those that failed.
    static func decodeEach(_ tx: PostgresTransaction, _ rows: PostgresRows, now: Timestamp) throws -> (
        tasks: [TaskRecord], failed: [String]
    ) {
        var tasks: [TaskRecord] = []
        var failed: [String] = []
        for index in 0..<rows.count {
            let row = PostgresRow(rows: rows, index: index)
            do {
                tasks.append(try decode(row))
            } catch {
                if let id = try failUnreadable(tx, sequence: row.int(0), "\(error)", now: now) { failed.append(id) }
            }
        }
        return (tasks, failed)
    }

    /// A task whose row cannot be decoded, met by a write that must move it on (a recovery, a
    /// takeover), fails with `TaskError.unreadableRow`, as SQLite's does: by its plain columns
    /// alone (a row that cannot be read cannot be rendered into an event), its lease released, its
    /// session's count of unfinished tasks moved. Its id; nil when it had ended already.
    static func failUnreadable(_ tx: PostgresTransaction, sequence: Int64, _ message: String, now: Timestamp) throws
        -> String?
    {
        let error = TaskRecord.errorJSON(.unreadableRow(message)).serialized()
        let rows = try tx.execute(
            """
            WITH old AS (SELECT seq, id, session_id, state FROM tasks WHERE seq = $1 FOR UPDATE)
            UPDATE tasks t SET state = 'failed', waiting_reason = NULL, finished_at = $2, error = $3, checkpoint = NULL,
                lease_node = NULL, lease_expires_at = NULL
            FROM old WHERE t.seq = old.seq AND old.state NOT IN ('completed', 'failed', 'cancelled')
            RETURNING old.id, old.session_id, old.state
            """, [.int(sequence), .double(now), .text(error)])
        guard rows.count > 0, let id = rows.string(0, 0) else { return nil }
        tx.countOpen(rows.string(0, 1) ?? "", -1)
        switch rows.string(0, 2) {
        case TaskState.running.rawValue:
            tx.changes.leftRunning.append(id)
            tx.leasesEnded.append(id)
        case TaskState.queued.rawValue: tx.changes.unqueued.append(sequence)
        default: break
        }
        return id
    }

    /// The node a task's file ties it to: nil when it is under a shared root (any node runs it).
    static func pin(for task: TaskRecord, node: String, sharedRoots: [String]) -> String? {
        let path = task.file.path
        for root in sharedRoots {
            let prefix = root.hasSuffix("/") ? root : root + "/"
            if path.hasPrefix(prefix) { return nil }
        }
        return node
    }

    static func requestColumn(_ task: TaskRecord) -> String { TaskRows.requestColumn(task.request) }

    static func configurationColumn(_ task: TaskRecord) -> String {
        task.configurationOverrides.isEmpty ? "{}" : JSON.object(task.configurationOverrides).serialized()
    }

    /// Inserts new tasks (numbered and pinned already), many rows a statement, sent with the
    /// transaction's next statement: a later read in it sees them.
    static func insert(_ tx: PostgresTransaction, _ tasks: [TaskRecord]) {
        let columns = 29
        for start in stride(from: 0, to: tasks.count, by: 500) {
            let part = tasks[start..<min(start + 500, tasks.count)]
            var sql = """
                INSERT INTO tasks (seq, id, session_id, kind, state, waiting_reason, file_path, file_size, file_mtime_ns,
                    request, upload, host_key, priority, description, idempotency_key, delete_file_on_success, configuration,
                    attempts, bytes_sent, created_at, started_at, finished_at, next_attempt_at, earliest_begin_at, deadline_at,
                    download, error, cancellation, pinned_node) VALUES
                """
            var values: [PostgresValue] = []
            values.reserveCapacity(part.count * columns)
            for (index, task) in part.enumerated() {
                sql += index == 0 ? " (" : ", ("
                sql += (1...columns).map { "$\(index * columns + $0)" }.joined(separator: ", ")
                sql += ")"
                values += [
                    .int(task.sequence), .text(task.id), .text(task.sessionID), .text(task.kind.rawValue),
                    .text(task.state.rawValue), .text(task.waitingReason?.rawValue), .text(task.file.path),
                    .int(task.file.size), .int(task.file.modifiedAtNanoseconds), .text(requestColumn(task)),
                    .text(TaskRows.uploadColumn(task)), .text(task.request.hostKey), .double(task.priority),
                    .text(task.description), .text(task.idempotencyKey), .flag(task.deleteFileOnSuccess),
                    .text(configurationColumn(task)), .int(task.attempts), .int(task.bytesTransferred),
                    .double(task.createdAt), .double(task.startedAt), .double(task.finishedAt), .double(task.nextAttemptAt),
                    .double(task.earliestBeginAt), .double(task.deadlineAt), .text(task.download.map { $0.json.serialized() }),
                    .text(task.error.map { TaskRecord.errorJSON($0).serialized() }), .int(task.cancellation?.rawValue),
                    .text(task.node),
                ]
            }
            // Nothing reads its answer: it goes with the transaction's next statement.
            tx.send(sql, values)
            for task in part {
                if !task.state.isFinal { tx.countOpen(task.sessionID, 1) }
                tx.changes.note(from: nil, to: task)
                if task.state == .queued, let node = task.node { tx.pins[task.sequence] = node }
            }
        }
    }

    /// Writes the columns in which `after` differs from `before` (the database counts the row's
    /// revision up), only while the row still meets `condition` (SQL, with `$1` the task's sequence
    /// and `$2` this node) when one is given. `before` is the row as read and locked in this
    /// transaction, or, `whileAtRevision`, the caller's copy: then the row is written only while it
    /// is still at that copy's revision, no one having changed it since (docs/fleet.md). `lease`
    /// sets or clears this node's lease with the change; `attempt` goes into the task's history in
    /// the same round trip, only if the row is written. Returns the task as written (its revision
    /// counted), nil when the row did not meet the condition.
    @discardableResult
    static func update(
        _ tx: PostgresTransaction, from before: TaskRecord, to after: TaskRecord, onlyIf condition: String? = nil,
        whileAtRevision: Bool = false, lease: LeaseChange = .keep, leaseSeconds: Double = 30,
        attempt: AttemptRecord? = nil
    ) throws -> TaskRecord? {
        var sets: [String] = []
        var values: [PostgresValue] = [.int(after.sequence)]
        // The node goes in as `$2` only where the statement uses it: PostgreSQL cannot type a
        // parameter the statement never mentions, and refuses it.
        if lease == .take || condition?.contains("$2") == true { values.append(.text(tx.node)) }
        func set(_ column: String, _ changed: Bool, _ value: @autoclosure () -> PostgresValue) {
            guard changed else { return }
            values.append(value())
            sets.append("\(column) = $\(values.count)")
        }
        set("state", before.state != after.state, .text(after.state.rawValue))
        set("waiting_reason", before.waitingReason != after.waitingReason, .text(after.waitingReason?.rawValue))
        let requestChanged = before.request != after.request
        set("request", requestChanged, .text(requestColumn(after)))
        set("host_key", requestChanged, .text(after.request.hostKey))
        set("priority", before.priority != after.priority, .double(after.priority))
        set(
            "configuration", before.configurationOverrides != after.configurationOverrides,
            .text(configurationColumn(after)))
        set("attempts", before.attempts != after.attempts, .int(after.attempts))
        set("bytes_sent", before.bytesTransferred != after.bytesTransferred, .int(after.bytesTransferred))
        set("started_at", before.startedAt != after.startedAt, .double(after.startedAt))
        set("finished_at", before.finishedAt != after.finishedAt, .double(after.finishedAt))
        set("next_attempt_at", before.nextAttemptAt != after.nextAttemptAt, .double(after.nextAttemptAt))
        set("earliest_begin_at", before.earliestBeginAt != after.earliestBeginAt, .double(after.earliestBeginAt))
        set("deadline_at", before.deadlineAt != after.deadlineAt, .double(after.deadlineAt))
        set("response", before.response != after.response, .text(after.response?.jsonText))
        set("error", before.error != after.error, .text(after.error.map { TaskRecord.errorJSON($0).serialized() }))
        set("cancellation", before.cancellation != after.cancellation, .int(after.cancellation?.rawValue))
        set("last_error", before.lastError != after.lastError, .text(after.lastError?.json.serialized()))
        set("checkpoint", before.checkpoint != after.checkpoint, .text(after.checkpoint?.json.serialized()))
        // The database counts the revision when the record changes, not for the lease alone.
        let countsRevision = !sets.isEmpty
        switch lease {
        case .keep: break
        case .take:
            values.append(.double(leaseSeconds))
            sets.append("lease_node = $2, lease_expires_at = clock_timestamp() + make_interval(secs => $\(values.count))")
        case .release:
            sets.append("lease_node = NULL, lease_expires_at = NULL")
        }
        guard !sets.isEmpty else {
            // Nothing to write, so nothing checks the row's revision: the caller reads the row.
            if whileAtRevision { return nil }
            if let attempt { try appendAttempt(tx, taskSequence: after.sequence, attempt) }
            return after
        }
        var conditions = condition.map { [$0] } ?? []
        if whileAtRevision {
            values.append(.int(before.revision))
            conditions.append("revision = $\(values.count)")
        }
        var sql =
            "UPDATE tasks SET \(sets.joined(separator: ", ")) WHERE seq = $1" + conditions.map { " AND \($0)" }.joined()
            + " RETURNING pinned_node"
        if let attempt {
            // The attempt goes in with the row, or not at all: from the update's answer.
            let statements = attemptStatements(attempt, from: "u", firstParameter: values.count + 1)
            values += statements.parameters
            sql = "WITH u AS (\(sql)), a AS (\(statements.insert)), d AS (\(statements.trim)) SELECT * FROM u"
        }
        let written = try tx.execute(sql, values)
        guard written.count > 0 else { return nil }
        // A `before` read stale makes this lower than the row's revision, never equal.
        var result = after
        if countsRevision { result.revision = before.revision + 1 }
        if !before.state.isFinal, after.state.isFinal { tx.countOpen(after.sessionID, -1) }
        if StoreChanges.concerns(from: before, to: after) {
            tx.changes.note(from: before, to: result)
            if after.state == .queued, let pin = written.string(0, 0) { tx.pins[after.sequence] = pin }
        }
        if before.state == .queued, after.state == .queued { tx.changes.touched.append(after.sequence) }
        tx.files.note(from: before, to: after)
        switch lease {
        case .keep: break
        case .take: tx.leasesTaken.append(after.id)
        case .release: tx.leasesEnded.append(after.id)
        }
        if before.state == .running, after.state != .running, lease == .keep { tx.leasesEnded.append(after.id) }
        return result
    }

    /// An attempt put into the history of the task `$1`, numbered after its last one, if `source`
    /// (SQL after `FROM`) holds a row: `insert`, and `trim`, which drops what falls beyond
    /// `AttemptRecord.historyLimit` with it. Both go into one statement, where each reads the history
    /// as it was before it. Their parameters follow from `firstParameter` on.
    static func attemptStatements(_ record: AttemptRecord, from source: String, firstParameter first: Int)
        -> (insert: String, trim: String, parameters: [PostgresValue])
    {
        let parameters: [PostgresValue] = [
            .double(record.startedAt), .double(record.endedAt), .int(record.bytesTransferred), .int(record.bytesReceived),
            .text(record.outcome.rawValue), .int(record.httpStatus ?? record.error?.httpStatus),
            .text(record.error.map { TaskRecord.errorJSON($0).serialized() }), .text(record.networkType?.rawValue),
            .int(AttemptRecord.historyLimit),
        ]
        let values = parameters.indices.dropLast().map { "$\(first + $0)" }.joined(separator: ", ")
        let next = "(SELECT COALESCE(max(number), 0) + 1 FROM attempts WHERE task_seq = $1)"
        return (
            """
            INSERT INTO attempts (task_seq, number, started_at, ended_at, bytes_sent, bytes_received, outcome, http_status,
                error, network_type) SELECT $1, \(next), \(values) FROM \(source)
            """,
            """
            DELETE FROM attempts WHERE task_seq = $1 AND number <= \(next) - $\(first + parameters.count - 1)
                AND EXISTS (SELECT 1 FROM \(source))
            """,
            parameters
        )
    }

    /// Appends an attempt to a task's history, if the task is still there.
    static func appendAttempt(_ tx: PostgresTransaction, taskSequence: Int64, _ record: AttemptRecord) throws {
        let attempt = attemptStatements(record, from: "tasks WHERE seq = $1", firstParameter: 2)
        try tx.execute("WITH a AS (\(attempt.insert)) \(attempt.trim)", [.int(taskSequence)] + attempt.parameters)
    }

    /// What an update does with the task's lease.
    enum LeaseChange {
        case keep
        /// This node takes the lease (a start).
        case take
        /// The lease goes (an end, a takeover).
        case release
    }

    /// A running attempt's progress and what the server acknowledged, while the task is still in
    /// that attempt on this node (sent with the transaction's next statement).
    static func saveProgress(
        _ tx: PostgresTransaction, sequence: Int64, attempt: Int, bytesTransferred: Int64, checkpoint: String? = nil
    ) {
        tx.send(
            """
            UPDATE tasks SET bytes_sent = $1, checkpoint = COALESCE($2, checkpoint)
            WHERE seq = $3 AND state = 'running' AND attempts = $4 AND lease_node = $5
            """, [.int(bytesTransferred), .text(checkpoint), .int(sequence), .int(attempt), .text(tx.node)])
    }

    /// Deletes finished tasks (their attempts go by the foreign key), their events and deliveries.
    static func deleteFinished(_ tx: PostgresTransaction, sequences: [Int64]) throws -> (tasks: Int, events: Int) {
        guard !sequences.isEmpty else { return (0, 0) }
        let list = PostgresValue.array(sequences)
        try tx.execute(
            """
            DELETE FROM deliveries WHERE event_seq IN (SELECT e.seq FROM events e JOIN tasks t ON e.task_id = t.id
                WHERE t.seq = ANY($1::bigint[]))
            """, [list])
        let events = try tx.execute(
            "DELETE FROM events WHERE task_id IN (SELECT id FROM tasks WHERE seq = ANY($1::bigint[]))", [list])
        let tasks = try tx.execute("DELETE FROM tasks WHERE seq = ANY($1::bigint[])", [list])
        tx.changes.pruned += tasks.affected
        return (tasks.affected, events.affected)
    }
}
