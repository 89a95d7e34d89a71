import BackhaulCore
import JSONCodec

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

    package static func request(_ value: JSON) -> RequestSpec? {
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
    /// Written member by member, with no copy of the spec's object: every task's row has it.
    package static func uploadColumn(_ task: TaskRecord) -> String {
        let stored = task.upload.storedJSON
        guard let identity = task.file.identity, case .object(let members) = stored else { return stored.serialized() }
        var writer = JSONWriter(capacity: 256)
        writer.object { column in
            for (name, member) in members.entries where name != "file_identity" {
                column.key(named: name)
                column.value(member)
            }
            column.key("file_identity")
            identity.writeJSON(to: &column)
        }
        return writer.text
    }

    /// The stored form of `UploadSpec.storedJSON`, read back as written.
    package static func upload(_ value: JSON) -> UploadSpec? {
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

extension Optional {
    /// The value, or `error` thrown.
    package func orThrow(_ error: @autoclosure () -> any Error) throws -> Wrapped {
        guard let self else { throw error() }
        return self
    }
}
