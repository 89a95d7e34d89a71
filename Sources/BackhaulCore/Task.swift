import JSONValue

public enum TaskKind: String, Sendable, CaseIterable {
    case upload, download
}

/// The request a task makes (OpenAPI/backhaul.yaml `request`), headers unredacted.
public struct RequestSpec: Sendable, Equatable {
    public var url: String { didSet { hostKey = Self.hostKey(of: url) } }
    public var method: String
    public var headers: [(String, String)]
    /// The URL's scheme://host:port, the key of per-host connection limits. Kept with the URL:
    /// the store, its change feed, the scheduler and the API ask for it a dozen times a task, and
    /// working it out each time cost 4,400 instructions a task.
    public private(set) var hostKey: String

    public init(url: String, method: String, headers: [(String, String)] = []) {
        self.url = url
        self.method = method
        self.headers = headers
        hostKey = Self.hostKey(of: url)
    }

    private static func hostKey(of url: String) -> String { URLParts(url)?.hostKey ?? url }

    public static func == (lhs: RequestSpec, rhs: RequestSpec) -> Bool {
        lhs.url == rhs.url && lhs.method == rhs.method && HeaderRules.sameSet(lhs.headers, rhs.headers)
    }

    /// `{"url", "method", "headers"}`; `redacted` hides secret header values (what is shown).
    public func writeJSON(to writer: inout JSONWriter, redacted: Bool) {
        writer.object { object in
            object.key("url")
            object.string(url)
            object.key("method")
            object.string(method)
            object.key("headers")
            object.value(HeaderRules.json(headers, redacted: redacted))
        }
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

    public func writeJSON(to writer: inout JSONWriter) {
        writer.object { object in
            object.key("path")
            object.string(path)
            object.key("size")
            object.int(size)
            object.key("modified_at")
            object.timestamp(Double(modifiedAtNanoseconds) / 1e9)
        }
    }
}

/// The final response of a task: status, headers, and at most 64 KiB of body. Its JSON is
/// written once, when it is made: a task's end stores it and puts it in the task's event too.
public struct ResponseRecord: Sendable, Equatable {
    public static let maxBodyBytes = 64 * 1024

    public let status: Int
    public let headers: [(String, String)]
    public let body: [UInt8]
    /// `{"status", "headers", "body", "body_encoding"}`, secret headers and cookies redacted, as
    /// stored and shown. A header named twice shows its last value where it first appeared.
    public let jsonText: String

    public init(status: Int, headers: [(String, String)], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body.count > Self.maxBodyBytes ? Array(body.prefix(Self.maxBodyBytes)) : body
        jsonText = Self.render(status: status, headers: headers, body: self.body)
    }

    public static func == (lhs: ResponseRecord, rhs: ResponseRecord) -> Bool {
        lhs.status == rhs.status && lhs.body == rhs.body && lhs.headers.elementsEqual(rhs.headers, by: ==)
    }

    public func writeJSON(to writer: inout JSONWriter) { writer.raw(jsonText) }

    private static func render(status: Int, headers: [(String, String)], body: [UInt8]) -> String {
        var writer = JSONWriter(capacity: 256 + body.count)
        writer.object { object in
            object.key("status")
            object.int(Int64(status))
            object.key("headers")
            object.object { shown in
                for index in headers.indices {
                    let name = headers[index].0
                    guard !headers[..<index].contains(where: { $0.0 == name }) else { continue }
                    let value = headers.last(where: { $0.0 == name })!.1
                    shown.key(named: name)
                    shown.string(HeaderRules.isHiddenInResponse(name) ? HeaderRules.redactedValue : value)
                }
            }
            // No body (most answers to an upload) is text; `String(validating:)` costs ~900
            // instructions even on no bytes.
            let text = body.isEmpty ? "" : String(validating: body, as: UTF8.self)
            object.key("body")
            object.string(text ?? Base64.encode(body))
            object.key("body_encoding")
            object.string(text == nil ? "base64" : "utf8")
        }
        return writer.text
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
    public var bytesTransferred: Int64
    public var bytesPerSecond: Double
    public init(bytesTransferred: Int64, bytesPerSecond: Double) {
        self.bytesTransferred = bytesTransferred
        self.bytesPerSecond = bytesPerSecond
    }
}

extension TaskRecord {
    /// The task object of OpenAPI/backhaul.yaml as JSON text, secrets redacted; `live` overrides the stored
    /// progress, `waitingReason` the stored reason.
    public func jsonText(live: LiveProgress? = nil, waitingReason shown: WaitingReason? = nil) -> String {
        var writer = JSONWriter()
        writeJSON(to: &writer, live: live, waitingReason: shown)
        return writer.text
    }

    /// Writes the task object of OpenAPI/backhaul.yaml (see `jsonText`) member by member: it is in every API
    /// answer about a task and in every event.
    public func writeJSON(to writer: inout JSONWriter, live: LiveProgress? = nil, waitingReason shown: WaitingReason? = nil) {
        // A download's size is known once the server has said it.
        let knownTotal = download == nil ? file.size : checkpoint?.total
        let total = knownTotal ?? 0
        let moved = live?.bytesTransferred ?? (state == .completed ? total : bytesTransferred)
        let rate = live?.bytesPerSecond ?? 0
        writer.object { json in
            json.key("id")
            json.string(id)
            json.key("session_id")
            json.string(sessionID)
            json.key("kind")
            json.string(kind.rawValue)
            json.key("state")
            json.string(state.rawValue)
            json.key("waiting_reason")
            json.string((shown ?? waitingReason)?.rawValue)
            if state == .authRequired {
                // docs/credentials.md: why new credentials (or a new URL) are wanted.
                json.key("auth")
                json.object { object in
                    object.key("reason")
                    object.string(authReason.rawValue)
                }
            }
            json.key("file")
            if download == nil { file.writeJSON(to: &json) } else { json.null() }
            json.key("request")
            request.writeJSON(to: &json, redacted: true)
            json.key("upload")
            if download == nil { json.value(upload.json(selection: checkpoint)) } else { json.null() }
            json.key("download")
            if let download { json.value(download.json) } else { json.null() }
            json.key("priority")
            json.double(priority)
            json.key("description")
            json.string(description)
            json.key("idempotency_key")
            json.string(idempotencyKey)
            json.key("delete_file_on_success")
            json.bool(deleteFileOnSuccess)
            json.key("configuration")
            json.value(Self.redactedOverrides(configurationOverrides))
            json.key("attempts")
            json.int(Int64(attempts))
            json.key("progress")
            json.object { progress in
                progress.key("bytes_sent")
                progress.int(download == nil ? moved : 0)
                progress.key("bytes_received")
                progress.int(download == nil ? 0 : moved)
                progress.key("bytes_total")
                progress.int(knownTotal)
                progress.key("fraction")
                progress.double(total > 0 ? min(1, Double(moved) / Double(total)) : (state == .completed ? 1 : 0))
                progress.key("bytes_per_second")
                progress.int(Int64(rate.rounded()))
                progress.key("eta_seconds")
                progress.double(
                    rate > 0 && state == .running && knownTotal != nil
                        ? (Double(max(0, total - moved)) / rate * 10).rounded() / 10 : nil)
            }
            json.key("created_at")
            json.timestamp(createdAt)
            json.key("started_at")
            json.timestamp(startedAt)
            json.key("finished_at")
            json.timestamp(finishedAt)
            json.key("next_attempt_at")
            json.timestamp(nextAttemptAt)
            json.key("earliest_begin_at")
            json.timestamp(earliestBeginAt)
            json.key("response")
            if let response { response.writeJSON(to: &json) } else { json.null() }
            json.key("error")
            if let error { json.value(Self.errorJSON(error)) } else { json.null() }
            json.key("last_error")
            if let lastError { json.value(lastError.json) } else { json.null() }
            json.key("cancellation")
            if let cancellation {
                json.object { object in
                    object.key("reason_code")
                    object.int(Int64(cancellation.rawValue))
                    object.key("reason")
                    object.string(cancellation.name)
                }
            } else {
                json.null()
            }
        }
    }

    /// Why the task wants new credentials: what its last failed attempt said (`credentials_expired`
    /// for an expired signature or token), else the server's 401.
    public var authReason: TaskError.Reason {
        guard let reason = lastError?.error.reason, reason == .credentialsExpired else { return .unauthorized }
        return reason
    }

    /// A task's error as `GET` shows it and the store keeps it; `reason` only when there is one.
    public static func errorJSON(_ error: TaskError) -> JSON {
        var object: JSONObject = [
            "code": .int(Int64(error.code)), "name": .string(error.name), "message": .string(error.message),
            "http_status": error.httpStatus.map { .int(Int64($0)) } ?? .null,
        ]
        if let reason = error.reason { object["reason"] = .string(reason.rawValue) }
        return .object(object)
    }

    public static func decodeError(_ value: JSON) -> TaskError? {
        guard let code = value["code"]?.intValue else { return nil }
        return TaskError(
            code: Int(code), name: value["name"]?.stringValue ?? "", message: value["message"]?.stringValue ?? "",
            httpStatus: value["http_status"]?.intValue.map { Int($0) },
            reason: value["reason"]?.stringValue.map(TaskError.Reason.init(rawValue:)))
    }

    private static func redactedOverrides(_ overrides: JSONObject) -> JSON {
        var copy = overrides
        if let headers = copy["default_headers"]?.objectValue {
            var redacted = JSONObject()
            for (name, value) in headers {
                redacted[name] = HeaderRules.isSecret(name) ? .string(HeaderRules.redactedValue) : value
            }
            copy["default_headers"] = .object(redacted)
        }
        return .object(copy)
    }
}

/// A session as stored (OpenAPI/backhaul.yaml).
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

    public init(
        id: String, configuration: TransferConfiguration, enabled: Bool = true, lifecycle: Lifecycle = .active,
        createdAt: Timestamp
    ) {
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
