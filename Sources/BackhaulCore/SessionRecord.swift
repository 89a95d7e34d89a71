import JSONValue

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
