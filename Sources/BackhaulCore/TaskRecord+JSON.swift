import JSONValue

/// Live transfer figures the engine keeps in memory for running tasks.
public struct LiveProgress: Sendable, Equatable {
    public var bytesTransferred: Int64
    public var bytesPerSecond: Double
    /// A background transfer's pacing (`progress.background`); nil for a `default` one.
    public var background: BackgroundPacing?
    public init(bytesTransferred: Int64, bytesPerSecond: Double, background: BackgroundPacing? = nil) {
        self.bytesTransferred = bytesTransferred
        self.bytesPerSecond = bytesPerSecond
        self.background = background
    }
}

/// What a background transfer yields to (docs/policy.md): the rate its path's LEDBAT controller
/// paces it at, and the queueing delay it measures.
public struct BackgroundPacing: Sendable, Equatable {
    /// This transfer's share of the path's rate (bytes/s).
    public var rateBytesPerSecond: Int64
    /// Seconds.
    public var queueDelay: Double
    public init(rateBytesPerSecond: Int64, queueDelay: Double) {
        self.rateBytesPerSecond = rateBytesPerSecond
        self.queueDelay = queueDelay
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
            if let node {
                json.key("node")
                json.string(node)
            }
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
                progress.key("background")
                if let background = live?.background {
                    progress.object { pacing in
                        pacing.key("rate_bytes_per_second")
                        pacing.int(background.rateBytesPerSecond)
                        pacing.key("queue_delay_ms")
                        pacing.double((background.queueDelay * 10_000).rounded() / 10)
                    }
                } else {
                    progress.null()
                }
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
