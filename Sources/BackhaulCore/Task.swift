import JSONValue

public enum TaskKind: String, Sendable, CaseIterable {
    case upload, download
}

/// The protocols an upload can speak (SPEC §2.2 `upload.protocol`).
public enum UploadProtocol: String, Sendable, CaseIterable {
    case raw, multipart, chunked, tus, s3
    /// draft-ietf-httpbis-resumable-upload (SPEC §4.1).
    case ietf
    /// One `OPTIONS` picks `ietf`, `tus` or `raw` (SPEC §4.1); see `ProtocolSelection`.
    case auto

    /// Protocols this build can carry out; the others are refused at enqueue.
    public static let supported: Set<UploadProtocol> = [.raw, .multipart, .chunked, .tus, .s3, .ietf, .auto]
}

/// The request a task makes (SPEC §2.2 `request`), headers unredacted.
public struct RequestSpec: Sendable, Equatable {
    public var url: String
    public var method: String
    public var headers: [(String, String)]

    public init(url: String, method: String, headers: [(String, String)] = []) {
        self.url = url
        self.method = method
        self.headers = headers
    }

    public static func == (lhs: RequestSpec, rhs: RequestSpec) -> Bool {
        lhs.url == rhs.url && lhs.method == rhs.method && HeaderRules.sameSet(lhs.headers, rhs.headers)
    }

    /// The URL's scheme://host:port, the key of per-host connection limits.
    public var hostKey: String { URLParts(url)?.hostKey ?? url }

    public func json(redacted: Bool) -> JSON {
        ["url": .string(url), "method": .string(method), "headers": HeaderRules.json(headers, redacted: redacted)]
    }
}

/// How the file is sent (SPEC §2.2 `upload`).
public struct UploadSpec: Sendable, Equatable {
    public var protocolName: UploadProtocol = .raw
    public var field = "file"
    public var filename: String?
    public var contentType: String?
    public var fields: [(String, String)] = []
    public var chunkSize: Int64?
    /// S3 credentials (`s3` protocol); stored to sign with, never shown.
    public var s3: S3Credentials?
    /// A digest computed while the file is read and sent with it.
    public var checksum: ChecksumAlgorithm?
    /// `ietf` (and `auto` when it picks ietf): the interop version to speak; nil: the newest the
    /// server takes (see `IETFUpload`).
    public var interopVersion: Int?

    public enum ChecksumAlgorithm: String, Sendable { case sha256 }

    public init(protocolName: UploadProtocol = .raw) { self.protocolName = protocolName }

    /// Field by field, the chunk size as it takes effect (unset is the protocol's default).
    public static func == (lhs: UploadSpec, rhs: UploadSpec) -> Bool {
        lhs.protocolName == rhs.protocolName && lhs.field == rhs.field && lhs.filename == rhs.filename
            && lhs.contentType == rhs.contentType && lhs.fields.elementsEqual(rhs.fields, by: ==)
            && lhs.effectiveChunkSize == rhs.effectiveChunkSize && lhs.s3 == rhs.s3 && lhs.checksum == rhs.checksum
            && lhs.interopVersion == rhs.interopVersion
    }

    /// The chunk size the protocol uses (what `json` shows).
    var effectiveChunkSize: Int64? {
        switch protocolName {
        case .chunked, .tus: return chunkSize ?? ChunkedUpload.defaultChunkSize
        case .s3: return S3Upload.partSize(chunkSize)
        default: return chunkSize
        }
    }

    /// What the database keeps: the API's view plus the S3 secrets needed to sign.
    public var storedJSON: JSON {
        guard let s3, case .object(var object) = json else { return json }
        object["s3"] = s3.json(redacted: false)
        return .object(object)
    }

    /// The API's view: S3 secrets left out.
    public var json: JSON {
        var object: JSONObject = ["protocol": .string(protocolName.rawValue)]
        if protocolName == .multipart {
            object["field"] = .string(field)
            if let filename { object["filename"] = .string(filename) }
            if let contentType { object["content_type"] = .string(contentType) }
            var formFields = JSONObject()
            for (name, value) in fields { formFields[name] = .string(value) }
            object["fields"] = .object(formFields)
        } else {
            // tus (and auto, should it pick tus) sends `filename` in its Upload-Metadata.
            if let filename, protocolName == .tus || protocolName == .auto { object["filename"] = .string(filename) }
            if let contentType { object["content_type"] = .string(contentType) }
        }
        if let checksum { object["checksum"] = .string(checksum.rawValue) }
        if protocolName == .ietf || protocolName == .auto { object["interop_version"] = interopVersion.map { .int(Int64($0)) } ?? .null }
        if protocolName == .chunked || protocolName == .tus || protocolName == .auto { object["chunk_size"] = .int(chunkSize ?? ChunkedUpload.defaultChunkSize) }
        else if protocolName == .s3 { object["chunk_size"] = .int(S3Upload.partSize(chunkSize)) }
        else if let chunkSize { object["chunk_size"] = .int(chunkSize) }
        return .object(object)
    }

    /// The API's view with what the upload learned from the server (SPEC §4.1): for `auto`, the
    /// protocol it picked (`protocol_selected`, null until the server answered) and a fallback
    /// after the server forgot the upload; for `ietf`, the interop version in use.
    public func json(selection checkpoint: UploadCheckpoint?) -> JSON {
        guard protocolName == .auto || protocolName == .ietf, case .object(var object) = json else { return json }
        if protocolName == .auto {
            object["protocol_selected"] = checkpoint?.protocolSelected.map { .string($0.rawValue) } ?? .null
            object["protocol_fallback"] = checkpoint?.fallback?.json ?? .null
        }
        let speaksIETF = protocolName == .ietf || checkpoint?.protocolSelected == .ietf
        object["interop_version_selected"] = speaksIETF ? checkpoint?.interopVersion.map { .int(Int64($0)) } ?? .null : .null
        return .object(object)
    }

    public static func decode(_ value: JSON?, path: String = "upload") throws(ValidationError) -> UploadSpec {
        guard let value, !value.isNull else { return UploadSpec() }
        let reader = try FieldReader(value, path: path)
        try reader.rejectUnknown(["protocol", "field", "filename", "content_type", "fields", "chunk_size", "s3", "checksum",
                                  "interop_version"])
        var spec = UploadSpec()
        if let name = try reader.string("protocol", maxLength: 32) {
            guard let parsed = UploadProtocol(rawValue: name) else {
                throw ValidationError(reader.field("protocol"), "must be one of raw, multipart, chunked, tus, s3, ietf, auto")
            }
            guard UploadProtocol.supported.contains(parsed) else {
                throw ValidationError(reader.field("protocol"), "\(name) is not available in this version")
            }
            spec.protocolName = parsed
        }
        if let field = try reader.string("field", maxLength: 256) {
            guard !field.isEmpty else { throw ValidationError(reader.field("field"), "must not be empty") }
            spec.field = field
        }
        spec.filename = try reader.string("filename", maxLength: 1024)
        spec.contentType = try reader.string("content_type", maxLength: 256)
        if let type = spec.contentType, type.unicodeScalars.contains(where: { $0.value < 0x20 }) {
            throw ValidationError(reader.field("content_type"), "must not contain control characters")
        }
        if let fields = try reader.stringMap("fields", maxEntries: 100, maxValueLength: 65_536) {
            spec.fields = fields
        }
        spec.chunkSize = try reader.integer("chunk_size", in: 1...(5 << 30))
        if spec.protocolName == .ietf, spec.chunkSize != nil {
            throw ValidationError(reader.field("chunk_size"), "is not used by the ietf protocol: the file goes in one request, resumed from the server's offset")
        }
        if spec.protocolName != .multipart, !spec.fields.isEmpty {
            throw ValidationError(reader.field("fields"), "is only for the multipart protocol")
        }
        if let s3 = try reader.object("s3") { spec.s3 = try S3Credentials.decode(s3) }
        if let name = try reader.string("checksum", maxLength: 16) {
            guard let algorithm = ChecksumAlgorithm(rawValue: name) else {
                throw ValidationError(reader.field("checksum"), "must be sha256")
            }
            if spec.protocolName == .multipart, spec.fields.contains(where: { $0.0 == MultipartPlan.digestFieldName }) {
                throw ValidationError(reader.field("fields"), "must not have a field named \(MultipartPlan.digestFieldName): the checksum goes there")
            }
            spec.checksum = algorithm
        }
        if let version = try reader.integer("interop_version", in: 0...1000) {
            guard spec.protocolName == .ietf || spec.protocolName == .auto else {
                throw ValidationError(reader.field("interop_version"), "is only for the ietf and auto protocols")
            }
            guard IETFUpload.interopVersions.contains(Int(version)) else {
                throw ValidationError(reader.field("interop_version"),
                                      "must be one of \(IETFUpload.interopVersions.map(String.init).joined(separator: ", "))")
            }
            spec.interopVersion = Int(version)
        }
        if spec.protocolName == .s3 {
            guard spec.s3 != nil else { throw ValidationError(reader.field("s3"), "is required for the s3 protocol") }
            if let size = spec.chunkSize, size < S3Upload.minimumPartSize {
                throw ValidationError(reader.field("chunk_size"), "must be at least 5 MiB (5242880) for s3")
            }
        } else if spec.s3 != nil {
            throw ValidationError(reader.field("s3"), "is only for the s3 protocol")
        }
        return spec
    }
}

/// The file at enqueue: its resolved path, size and modification time (nanoseconds).
public struct FileInfo: Sendable, Equatable {
    public var path: String
    public var size: Int64
    public var modifiedAtNanoseconds: Int64

    public init(path: String, size: Int64, modifiedAtNanoseconds: Int64) {
        self.path = path
        self.size = size
        self.modifiedAtNanoseconds = modifiedAtNanoseconds
    }

    public var json: JSON {
        ["path": .string(path), "size": .int(size),
         "modified_at": .string(RFC3339.format(Double(modifiedAtNanoseconds) / 1e9))]
    }
}

/// The final response of a task: status, headers, and at most 64 KiB of body.
public struct ResponseRecord: Sendable, Equatable {
    public static let maxBodyBytes = 64 * 1024

    public var status: Int
    public var headers: [(String, String)]
    public var body: [UInt8]

    public init(status: Int, headers: [(String, String)], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = Array(body.prefix(Self.maxBodyBytes))
    }

    public static func == (lhs: ResponseRecord, rhs: ResponseRecord) -> Bool {
        lhs.status == rhs.status && lhs.body == rhs.body && lhs.headers.elementsEqual(rhs.headers, by: ==)
    }

    public var json: JSON {
        var headerObject = JSONObject()
        for (name, value) in headers {
            let shown = HeaderRules.isSecret(name) || name.lowercased() == "set-cookie" ? HeaderRules.redactedValue : value
            headerObject[name] = .string(shown)
        }
        let text = String(validating: body, as: UTF8.self)
        return [
            "status": .int(Int64(status)), "headers": .object(headerObject),
            "body": .string(text ?? Base64.encode(body)),
            "body_encoding": .string(text == nil ? "base64" : "utf8"),
        ]
    }

    public static func decode(_ value: JSON) -> ResponseRecord? {
        guard let status = value["status"]?.intValue else { return nil }
        var headers: [(String, String)] = []
        for (name, value) in value["headers"]?.objectValue ?? [:] { headers.append((name, value.stringValue ?? "")) }
        let text = value["body"]?.stringValue ?? ""
        let body = value["body_encoding"]?.stringValue == "base64" ? (Base64.decode(text) ?? []) : Array(text.utf8)
        return ResponseRecord(status: Int(status), headers: headers, body: body)
    }
}

/// Live transfer figures the engine keeps in memory for running tasks.
public struct LiveProgress: Sendable, Equatable {
    public var bytesSent: Int64
    public var bytesPerSecond: Double
    public init(bytesSent: Int64, bytesPerSecond: Double) {
        self.bytesSent = bytesSent
        self.bytesPerSecond = bytesPerSecond
    }
}

/// A task as stored: everything needed to run it and to show it.
public struct TaskRecord: Sendable, Equatable {
    public var id: String
    public var sequence: Int64 = 0
    public var sessionID: String
    public var kind: TaskKind = .upload
    public var state: TaskState = .queued
    public var waitingReason: WaitingReason?
    public var file: FileInfo
    public var request: RequestSpec
    public var upload: UploadSpec
    public var priority: Double = 0.5
    public var description: String?
    public var idempotencyKey: String?
    public var deleteFileOnSuccess = false
    /// The task's own configuration overrides, as given (applied over the session's).
    public var configurationOverrides: JSONObject = [:]
    public var attempts = 0
    public var bytesSent: Int64 = 0
    public var createdAt: Timestamp
    public var startedAt: Timestamp?
    public var finishedAt: Timestamp?
    public var nextAttemptAt: Timestamp?
    public var earliestBeginAt: Timestamp?
    /// When the resource timeout ends the task.
    public var deadlineAt: Timestamp
    public var response: ResponseRecord?
    public var error: TaskError?
    /// The error of the latest failed attempt (SPEC §4.2), kept after the task ends.
    public var lastError: LastError?
    public var cancellation: CancellationReason?
    /// A resumable protocol's progress (what the server acknowledged; for a download, what is
    /// durably in the `.part` file).
    public var checkpoint: UploadCheckpoint?
    /// A download's destination (nil for uploads).
    public var download: DownloadSpec?

    public init(id: String, sessionID: String, file: FileInfo, request: RequestSpec, upload: UploadSpec,
                createdAt: Timestamp, deadlineAt: Timestamp) {
        self.id = id
        self.sessionID = sessionID
        self.file = file
        self.request = request
        self.upload = upload
        self.createdAt = createdAt
        self.deadlineAt = deadlineAt
    }

    /// The task object of SPEC §2.2, secrets redacted; `live` overrides the stored progress.
    public func json(live: LiveProgress? = nil) -> JSON {
        // A download's size is known once the server has said it.
        let knownTotal = download == nil ? file.size : checkpoint?.total
        let total = knownTotal ?? 0
        let moved = live?.bytesSent ?? (state == .completed ? total : bytesSent)
        let rate = live?.bytesPerSecond ?? 0
        var progress = JSONObject()
        progress.reserveCapacity(6)
        progress.append("bytes_sent", .int(download == nil ? moved : 0))
        progress.append("bytes_received", .int(download == nil ? 0 : moved))
        progress.append("bytes_total", knownTotal.map { .int($0) } ?? .null)
        progress.append("fraction", .double(total > 0 ? min(1, Double(moved) / Double(total)) : (state == .completed ? 1 : 0)))
        progress.append("bytes_per_second", .int(Int64(rate.rounded())))
        progress.append("eta_seconds", rate > 0 && state == .running && knownTotal != nil
            ? .double((Double(max(0, total - moved)) / rate * 10).rounded() / 10) : .null)

        var object = JSONObject()
        object.reserveCapacity(26)
        object.append("id", .string(id))
        object.append("session_id", .string(sessionID))
        object.append("kind", .string(kind.rawValue))
        object.append("state", .string(state.rawValue))
        object.append("waiting_reason", waitingReason.map { .string($0.rawValue) } ?? .null)
        object.append("file", download == nil ? file.json : .null)
        object.append("request", request.json(redacted: true))
        object.append("upload", download == nil ? upload.json(selection: checkpoint) : .null)
        object.append("download", download?.json ?? .null)
        object.append("priority", .double(priority))
        object.append("description", description.map { .string($0) } ?? .null)
        object.append("idempotency_key", idempotencyKey.map { .string($0) } ?? .null)
        object.append("delete_file_on_success", .bool(deleteFileOnSuccess))
        object.append("configuration", Self.redactedOverrides(configurationOverrides))
        object.append("attempts", .int(Int64(attempts)))
        object.append("progress", .object(progress))
        object.append("created_at", .string(RFC3339.format(createdAt)))
        object.append("started_at", startedAt.map { .string(RFC3339.format($0)) } ?? .null)
        object.append("finished_at", finishedAt.map { .string(RFC3339.format($0)) } ?? .null)
        object.append("next_attempt_at", nextAttemptAt.map { .string(RFC3339.format($0)) } ?? .null)
        object.append("earliest_begin_at", earliestBeginAt.map { .string(RFC3339.format($0)) } ?? .null)
        object.append("response", response?.json ?? .null)
        object.append("error", error.map(Self.errorJSON) ?? .null)
        object.append("last_error", lastError?.json ?? .null)
        object.append("cancellation", cancellation.map { ["reason_code": .int(Int64($0.rawValue)), "reason": .string($0.name)] } ?? .null)
        return .object(object)
    }

    public static func errorJSON(_ error: TaskError) -> JSON {
        ["code": .int(Int64(error.code)), "name": .string(error.name), "message": .string(error.message),
         "http_status": error.httpStatus.map { .int(Int64($0)) } ?? .null]
    }

    public static func decodeError(_ value: JSON) -> TaskError? {
        guard let code = value["code"]?.intValue else { return nil }
        return TaskError(code: Int(code), name: value["name"]?.stringValue ?? "", message: value["message"]?.stringValue ?? "",
                         httpStatus: value["http_status"]?.intValue.map { Int($0) })
    }

    private static func redactedOverrides(_ overrides: JSONObject) -> JSON {
        var copy = overrides
        if let headers = copy["default_headers"]?.objectValue {
            var redacted = JSONObject()
            for (name, value) in headers { redacted[name] = HeaderRules.isSecret(name) ? .string(HeaderRules.redactedValue) : value }
            copy["default_headers"] = .object(redacted)
        }
        return .object(copy)
    }
}

/// A session as stored (SPEC §2.1).
public struct SessionRecord: Sendable, Equatable {
    public enum Lifecycle: String, Sendable {
        case active
        /// `DELETE ?mode=finish`: accepted tasks finish, new ones are refused, the record goes when empty.
        case finishing
    }

    public var id: String
    public var configuration: TransferConfiguration
    public var enabled: Bool
    public var lifecycle: Lifecycle
    public var createdAt: Timestamp

    public init(id: String, configuration: TransferConfiguration, enabled: Bool = true, lifecycle: Lifecycle = .active,
                createdAt: Timestamp) {
        self.id = id
        self.configuration = configuration
        self.enabled = enabled
        self.lifecycle = lifecycle
        self.createdAt = createdAt
    }

    public func json(taskCounts: [TaskState: Int]) -> JSON {
        var counts = JSONObject()
        for state in TaskState.allCases { counts[state.rawValue] = .int(Int64(taskCounts[state] ?? 0)) }
        return [
            "id": .string(id), "configuration": configuration.json(redacted: true), "enabled": .bool(enabled),
            "state": .string(lifecycle.rawValue), "created_at": .string(RFC3339.format(createdAt)),
            "task_counts": .object(counts),
        ]
    }

    /// `[A-Za-z0-9._-]{1,128}`
    public static func isValidID(_ id: String) -> Bool {
        guard (1...128).contains(id.utf8.count) else { return false }
        return id.utf8.allSatisfy { byte in
            (byte >= 48 && byte <= 57) || (byte >= 65 && byte <= 90) || (byte >= 97 && byte <= 122) || byte == 46
                || byte == 95 || byte == 45
        }
    }
}
