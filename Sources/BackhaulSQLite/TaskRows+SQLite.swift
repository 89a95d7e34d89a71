import BackhaulCore
import BackhaulQueue
import JSONCodec
import SQLite

/// Writing the `tasks` table in SQLite: every write is reported to the transaction's `TaskFeed`.
extension TaskRows {
    /// Inserts new tasks, each numbered already (`Store.nextSequence`), many rows a
    /// statement.
    static func insert(_ db: Connection, _ tasks: some Collection<TaskRecord>, feed: TaskFeed) throws {
        try rowInsert.run(db, tasks, values: appendInsertValues)
        for task in tasks { feed.inserted(task) }
    }

    static let rowInsert = RowInsert(
        """
        INSERT INTO tasks (seq, id, session_id, kind, state, waiting_reason, file_path, file_size, file_mtime_ns, request,
            upload, host_key, priority, description, idempotency_key, delete_file_on_success, configuration, attempts,
            bytes_sent, created_at, started_at, finished_at, next_attempt_at, earliest_begin_at, deadline_at, download,
            error, cancellation)
        """, columns: 28)

    static func appendInsertValues(_ task: TaskRecord, to values: inout [any SQLBindable]) {
        precondition(task.sequence > 0, "a new task is numbered before it is inserted")
        values += [
            task.sequence, task.id, task.sessionID, task.kind.rawValue, task.state.rawValue, task.waitingReason?.rawValue,
            task.file.path, task.file.size, task.file.modifiedAtNanoseconds, requestColumn(task.request),
            uploadColumn(task), task.request.hostKey, task.priority, task.description, task.idempotencyKey,
            task.deleteFileOnSuccess,
            task.configurationOverrides.isEmpty ? "{}" : JSON.object(task.configurationOverrides).serialized(),
            task.attempts, task.bytesTransferred, task.createdAt, task.startedAt, task.finishedAt, task.nextAttemptAt,
            task.earliestBeginAt,
            task.deadlineAt, task.download.map { $0.json.serialized() },
            task.error.map { TaskRecord.errorJSON($0).serialized() },
            task.cancellation?.rawValue,
        ]
    }

    /// Writes the columns in which `after` differs from `before` (the row as read), only while
    /// the row still meets `condition` (SQL) when one is given. Returns whether it wrote.
    @discardableResult
    static func update(
        _ db: Connection, from before: TaskRecord, to after: TaskRecord, onlyIf condition: String? = nil, feed: TaskFeed
    ) throws -> Bool {
        // Field by field, compared directly (key paths are slow to project, and this runs twice per
        // task); the SQL is put together as bytes (appending to a String cost 5,000 instructions).
        var update = ColumnUpdate()
        update.set("state", before.state != after.state, after.state.rawValue)
        update.set("waiting_reason", before.waitingReason != after.waitingReason, after.waitingReason?.rawValue)
        let requestChanged = before.request != after.request
        update.set("request", requestChanged, requestColumn(after.request))
        update.set("host_key", requestChanged, after.request.hostKey)
        update.set("priority", before.priority != after.priority, after.priority)
        update.set(
            "configuration", before.configurationOverrides != after.configurationOverrides,
            after.configurationOverrides.isEmpty ? "{}" : JSON.object(after.configurationOverrides).serialized())
        update.set("attempts", before.attempts != after.attempts, after.attempts)
        update.set("bytes_sent", before.bytesTransferred != after.bytesTransferred, after.bytesTransferred)
        update.set("started_at", before.startedAt != after.startedAt, after.startedAt)
        update.set("finished_at", before.finishedAt != after.finishedAt, after.finishedAt)
        update.set("next_attempt_at", before.nextAttemptAt != after.nextAttemptAt, after.nextAttemptAt)
        update.set("earliest_begin_at", before.earliestBeginAt != after.earliestBeginAt, after.earliestBeginAt)
        update.set("deadline_at", before.deadlineAt != after.deadlineAt, after.deadlineAt)
        update.set("response", before.response != after.response, after.response?.jsonText)
        update.set("error", before.error != after.error, after.error.map { TaskRecord.errorJSON($0).serialized() })
        update.set("cancellation", before.cancellation != after.cancellation, after.cancellation?.rawValue)
        update.set("last_error", before.lastError != after.lastError, after.lastError?.json.serialized())
        update.set("checkpoint", before.checkpoint != after.checkpoint, after.checkpoint?.json.serialized())
        guard !update.values.isEmpty else { return true }
        update.values.append(after.sequence)
        update.append(" WHERE seq = ?")
        if let condition {
            update.append(" AND ")
            update.sql.append(contentsOf: condition.utf8)
        }
        guard try db.run(String(decoding: update.sql, as: UTF8.self), update.values) > 0 else { return false }
        feed.updated(from: before, to: after)
        return true
    }

    /// A running attempt's progress, and what the server acknowledged of a resumable transfer,
    /// while the task is still in that attempt (no column the feed reports).
    static func saveProgress(
        _ db: Connection, sequence: Int64, attempt: Int, bytesTransferred: Int64, checkpoint: String? = nil
    ) throws {
        try db.run(
            """
            UPDATE tasks SET bytes_sent = ?, checkpoint = COALESCE(?, checkpoint)
            WHERE seq = ? AND state = 'running' AND attempts = ?
            """, [bytesTransferred, checkpoint, sequence, attempt])
    }

    /// Deletes tasks by sequence (with their attempt history, by trigger).
    static func delete(_ db: Connection, sequences: [Int64], feed: TaskFeed) throws {
        let list = JSON.array(sequences.map { .int($0) }).serialized()
        let rows = try db.query(
            "SELECT seq, id, session_id, state FROM tasks WHERE seq IN (SELECT value FROM json_each(?))", [list]
        ) { row in
            (
                row.int(0), row.string(1), row.string(2),
                try TaskState(rawValue: row.string(3)).orThrow(
                    StoreError.corrupt("task \(row.string(1)) is in the state \(row.string(3))"))
            )
        }
        try db.run("DELETE FROM tasks WHERE seq IN (SELECT value FROM json_each(?))", [list])
        for (sequence, id, session, state) in rows { feed.deleted(sequence: sequence, id: id, session: session, state: state) }
    }

    /// Detaches a removed session's tasks (all final): they belong to no session ('') and keep
    /// the id they had in `detached_from`.
    static func detach(_ db: Connection, session: String, feed: TaskFeed) throws {
        try db.run("UPDATE tasks SET detached_from = session_id, session_id = '' WHERE session_id = ?", [session])
        feed.detached(session: session)
    }

    static func fetch(_ db: Connection, id: String) throws -> TaskRecord? {
        try db.queryFirst("SELECT \(columns) FROM tasks WHERE id = ?", [id], decode)
    }

    static func fetch(_ db: Connection, sequence: Int64) throws -> TaskRecord? {
        try db.queryFirst("SELECT \(columns) FROM tasks WHERE seq = ?", [sequence], decode)
    }

    /// The task at `sequence` read with no checkpoint (`ignoringCheckpoint`): what is left of a row
    /// whose checkpoint this build cannot read, to fail it.
    static func fetch(_ db: Connection, sequence: Int64, ignoringCheckpoint: Bool) throws -> TaskRecord? {
        try db.queryFirst(
            "SELECT \(ignoringCheckpoint ? columnsWithoutCheckpoint : columns) FROM tasks WHERE seq = ?", [sequence], decode)
    }

    /// Drops a task's checkpoint (no column the feed reports): what is left of a row whose
    /// checkpoint cannot be read.
    static func dropCheckpoint(_ db: Connection, sequence: Int64) throws {
        try db.run("UPDATE tasks SET checkpoint = NULL WHERE seq = ?", [sequence])
    }

    /// `columns` with NULL for the checkpoint.
    private static let columnsWithoutCheckpoint = columns.replacing("cancellation, checkpoint,", with: "cancellation, NULL,")
}

extension Row: StoredRow {}

/// A task row's update being put together: the columns that changed and their values. A value
/// of its own rather than variables a nested function captures, which the runtime checks on every
/// access.
private struct ColumnUpdate {
    var sql: [UInt8] = Array("UPDATE tasks SET ".utf8)
    var values: [any SQLBindable] = []

    init() {
        sql.reserveCapacity(256)
        values.reserveCapacity(8)
    }

    mutating func append(_ text: StaticString) { text.withUTF8Buffer { sql.append(contentsOf: $0) } }

    /// Sets `column` to `value` when `changed`.
    mutating func set(_ column: StaticString, _ changed: Bool, _ value: @autoclosure () -> any SQLBindable) {
        guard changed else { return }
        if !values.isEmpty { append(", ") }
        append(column)
        append(" = ?")
        values.append(value())
    }
}
