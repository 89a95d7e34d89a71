import BackhaulCore
import BackhaulQueue
import JSONCodec

/// A validated `PATCH /v1/tasks/{id}`: priority, request headers (merged; null removes), the
/// request's URL and method (a task that is not running: docs/credentials.md), earliest_begin_at (null
/// clears), configuration (merged; null removes an override).
struct TaskPatch: Sendable {
    var priority: Double?
    var headers: [(String, JSON)] = []
    var url: String?
    var method: String?
    var earliestBeginAt: Timestamp??
    var configuration: JSONObject?

    static func decode(_ value: JSON, session: TransferConfiguration) throws(ValidationError) -> TaskPatch {
        let reader = try FieldReader(value)
        try reader.rejectUnknown(["priority", "request", "earliest_begin_at", "configuration"])
        var patch = TaskPatch()
        patch.priority = try reader.number("priority", in: 0...1)
        if let request = try reader.object("request") {
            try request.rejectUnknown(["headers", "url", "method"])
            if let url = try request.string("url", maxLength: 8192) {
                guard URLParts(url) != nil else {
                    throw ValidationError(request.field("url"), "must be an absolute http or https URL")
                }
                patch.url = url
            }
            if let method = try request.string("method", maxLength: 16)?.uppercased() {
                guard TaskDraft.methods.contains(method) || method == "GET" else {
                    throw ValidationError(request.field("method"), "must be PUT, POST or PATCH (GET for a download)")
                }
                patch.method = method
            }
            if let headers = try request.object("headers") {
                for (name, value) in headers.object {
                    if case .string(let text) = value {
                        try HeaderRules.validate(name: name, value: text, field: headers.path)
                    } else if !value.isNull {
                        throw ValidationError(headers.field(name), "must be a string, or null to remove the header")
                    }
                    patch.headers.append((name, value))
                }
            }
        }
        if reader.has("earliest_begin_at") {
            patch.earliestBeginAt = .some(try reader.timestamp("earliest_begin_at"))
        }
        if let configuration = try reader.object("configuration") {
            patch.configuration = configuration.object
        }
        return patch
    }

    /// Changes the task as read in the store's transaction. A new URL or method is refused (409)
    /// while an attempt runs: its requests already went to the old one.
    func apply(to task: inout TaskRecord, session: TransferConfiguration) throws {
        if let priority { task.priority = priority }
        if url != nil || method != nil {
            guard task.state != .running else {
                throw StoreError.conflict("the task is running: its URL can change only while it is not (suspend it first)")
            }
            let method = method ?? task.request.method
            guard (task.kind == .download) == (method == "GET") else {
                throw ValidationError(
                    "request.method", task.kind == .download ? "must be GET for a download" : "must be PUT, POST or PATCH")
            }
            task.retarget(url: url ?? task.request.url, method: method)
        }
        for (name, value) in headers {
            task.request.headers.removeAll { $0.0.lowercased() == name.lowercased() }
            if case .string(let text) = value { task.request.headers.append((name, text)) }
        }
        if let earliestBeginAt { task.earliestBeginAt = earliestBeginAt }
        if let configuration {
            var overrides = task.configurationOverrides
            for (key, value) in configuration { overrides[key] = value.isNull ? nil : value }
            let effective = try session.applying(.object(overrides))
            task.configurationOverrides = overrides
            task.deadlineAt = task.createdAt + effective.timeoutIntervalForResource
        }
    }
}
