import BackhaulCore
import JSONCodec
import SQLite

/// How a task is stored: its row decoded without the client's validators (what was written was
/// validated once, at the edge), throwing `StoreError.corrupt` on anything it cannot read rather
/// than guessing; written whole once, then column by column as it changes. The only code that
/// writes the `tasks` table: every write is reported to the transaction's `TaskFeed`.
package enum TaskRows {
    package static let columns = """
        seq, id, session_id, kind, state, waiting_reason, file_path, file_size, file_mtime_ns, request, upload, \
        priority, description, idempotency_key, delete_file_on_success, configuration, attempts, bytes_sent, \
        created_at, started_at, finished_at, next_attempt_at, earliest_begin_at, deadline_at, response, error, \
        cancellation, checkpoint, download, detached_from, last_error
        """

    package static func decode(_ row: some StoredRow) throws -> TaskRecord {
        let id = row.string(1)
        func corrupt(_ what: String) -> StoreError { .corrupt("task \(id) has \(what)") }
        func object(_ column: Int32, _ name: String) throws -> JSON {
            let text = row.string(column)
            do { return try JSON.parse(text, maxDepth: 64) } catch { throw corrupt("the \(name) \(text.prefix(200))") }
        }
        let uploadColumn = try object(10, "upload")
        var task = TaskRecord(
            id: id, sessionID: row.optionalString(29) ?? row.string(2),
            file: FileInfo(path: row.string(6), size: row.int(7), modifiedAtNanoseconds: row.int(8)),
            request: try request(object(9, "request")).orThrow(corrupt("the request \(row.string(9).prefix(200))")),
            upload: try upload(uploadColumn).orThrow(corrupt("the upload \(row.string(10).prefix(200))")),
            createdAt: row.double(18), deadlineAt: row.double(23))
        task.file.identity = uploadColumn["file_identity"].flatMap(FileIdentity.init)
        task.sequence = row.int(0)
        guard let kind = TaskKind(rawValue: row.string(3)), let state = TaskState(rawValue: row.string(4)) else {
            throw StoreError.corrupt("task \(id) has kind \(row.string(3)) and state \(row.string(4))")
        }
        task.kind = kind
        task.state = state
        if let reason = row.optionalString(5) {
            guard let parsed = WaitingReason(rawValue: reason) else {
                throw StoreError.corrupt("task \(id) waits for the reason \(reason)")
            }
            task.waitingReason = parsed
        }
        task.priority = row.double(11)
        task.description = row.optionalString(12)
        task.idempotencyKey = row.optionalString(13)
        task.deleteFileOnSuccess = row.int(14) != 0
        task.configurationOverrides = try overrides(row.string(15), task: id)
        task.attempts = Int(row.int(16))
        task.bytesTransferred = row.int(17)
        task.startedAt = row.optionalDouble(19)
        task.finishedAt = row.optionalDouble(20)
        task.nextAttemptAt = row.optionalDouble(21)
        task.earliestBeginAt = row.optionalDouble(22)
        if !row.isNull(24) {
            task.response = try ResponseRecord.decode(try object(24, "response")).orThrow(corrupt("a response it cannot read"))
        }
        if !row.isNull(25) {
            task.error = try TaskRecord.decodeError(try object(25, "error")).orThrow(corrupt("an error it cannot read"))
        }
        if let code = row.optionalInt(26) {
            task.cancellation = try CancellationReason(rawValue: Int(code)).orThrow(corrupt("the cancellation reason \(code)"))
        }
        if !row.isNull(27) {
            task.checkpoint = try TransferCheckpoint(try object(27, "checkpoint")).orThrow(corrupt("a checkpoint it cannot read"))
        }
        if !row.isNull(28) {
            task.download = try DownloadSpec(try object(28, "download")).orThrow(corrupt("a download it cannot read"))
        }
        if !row.isNull(30) {
            task.lastError = try LastError.decode(try object(30, "last error")).orThrow(corrupt("a last error it cannot read"))
        }
        return task
    }

    /// A task's stored configuration overrides: an object ("{}" when it has none).
    package static func overrides(_ text: String, task: String) throws -> JSONObject {
        if text == "{}" { return [:] }
        guard let object = (try? JSON.parse(text, maxDepth: 64))?.objectValue else {
            throw StoreError.corrupt("task \(task) has the configuration \(text.prefix(200))")
        }
        return object
    }

    static func request(_ value: JSON) -> RequestSpec? {
        guard let url = value["url"]?.stringValue, let method = value["method"]?.stringValue else { return nil }
        var headers: [(String, String)] = []
        for (name, header) in value["headers"]?.objectValue ?? [:] {
            guard let text = header.stringValue else { return nil }
            headers.append((name, text))
        }
        return RequestSpec(url: url, method: method, headers: headers)
    }

    /// The `upload` column: `UploadSpec.storedJSON`, and the file's identity at enqueue
    /// (`file_identity`). The identity is kept there, not in columns of its own, because like the
    /// spec it is written once with the row and read with it, and so needs no migration in either
    /// database.
    package static func uploadColumn(_ task: TaskRecord) -> String {
        guard let identity = task.file.identity, case .object(var object) = task.upload.storedJSON else {
            return task.upload.storedJSON.serialized()
        }
        object["file_identity"] = identity.json
        return JSON.object(object).serialized()
    }

    /// The stored form of `UploadSpec.storedJSON`, read back as written.
    static func upload(_ value: JSON) -> UploadSpec? {
        guard let name = value["protocol"]?.stringValue, let protocolName = UploadProtocol(rawValue: name) else { return nil }
        var spec = UploadSpec(protocolName: protocolName)
        if let field = value["field"]?.stringValue { spec.field = field }
        spec.filename = value["filename"]?.stringValue
        spec.contentType = value["content_type"]?.stringValue
        for (name, field) in value["fields"]?.objectValue ?? [:] {
            guard let text = field.stringValue else { return nil }
            spec.fields.append((name, text))
        }
        spec.chunkSize = value["chunk_size"]?.intValue
        if let checksum = value["checksum"]?.stringValue {
            guard let algorithm = UploadSpec.ChecksumAlgorithm(rawValue: checksum) else { return nil }
            spec.checksum = algorithm
        }
        spec.interopVersion = value["interop_version"]?.intValue.map { Int($0) }
        if let s3 = value["s3"] {
            guard let region = s3["region"]?.stringValue, let key = s3["access_key_id"]?.stringValue,
                let secret = s3["secret_access_key"]?.stringValue
            else { return nil }
            spec.s3 = S3Credentials(
                region: region, accessKeyID: key, secretAccessKey: secret, sessionToken: s3["session_token"]?.stringValue)
        }
        return spec
    }

    package static func requestColumn(_ request: RequestSpec) -> String {
        var writer = JSONWriter(capacity: 256)
        request.writeJSON(to: &writer, redacted: false)
        return writer.text
    }

    /// Inserts new tasks, each numbered already (`Store.Admission.nextSequence`), many rows a
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

/// A stored row's columns by index, as `TaskRows.decode` reads them: SQLite's `Row`, and the
/// PostgreSQL store's rows.
package protocol StoredRow {
    func isNull(_ column: Int32) -> Bool
    func int(_ column: Int32) -> Int64
    func optionalInt(_ column: Int32) -> Int64?
    func double(_ column: Int32) -> Double
    func optionalDouble(_ column: Int32) -> Double?
    func string(_ column: Int32) -> String
    func optionalString(_ column: Int32) -> String?
}

extension Row: StoredRow {}

extension Optional {
    /// The value, or `error` thrown.
    package func orThrow(_ error: @autoclosure () -> any Error) throws -> Wrapped {
        guard let self else { throw error() }
        return self
    }
}

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
