import BackhaulCore
import JSON

/// A validated `PATCH /v1/tasks/{id}`: priority, request headers (merged; null removes),
/// earliest_begin_at (null clears), configuration (merged; null removes an override).
struct TaskPatch: Sendable {
    var priority: Double?
    var headers: [(String, JSON)] = []
    var earliestBeginAt: Timestamp??
    var configuration: JSONObject?

    static func decode(_ value: JSON, session: TransferConfiguration) throws(ValidationError) -> TaskPatch {
        let reader = try FieldReader(value)
        try reader.rejectUnknown(["priority", "request", "earliest_begin_at", "configuration"])
        var patch = TaskPatch()
        patch.priority = try reader.number("priority", in: 0...1)
        if let request = try reader.object("request") {
            try request.rejectUnknown(["headers"])
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

    func apply(to task: inout TaskRecord, session: TransferConfiguration) throws(ValidationError) {
        if let priority { task.priority = priority }
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
