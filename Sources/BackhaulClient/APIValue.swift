/// A JSON value where the API gives no fixed schema (a task's configuration overrides, the
/// daemon's settings in `/v1/info`). Objects are dictionaries: their members' order is not kept.
public enum APIValue: Sendable, Equatable, Codable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([APIValue])
    case object([String: APIValue])

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([APIValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: APIValue].self))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .number(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// An object's member (nil for a missing one, or when this is not an object).
    public subscript(key: String) -> APIValue? {
        guard case .object(let members) = self else { return nil }
        return members[key]
    }

    /// The string, when this is one; likewise `numberValue` and `boolValue`.
    public var stringValue: String? {
        guard case .string(let value) = self else { return nil }
        return value
    }

    public var numberValue: Double? {
        guard case .number(let value) = self else { return nil }
        return value
    }

    public var boolValue: Bool? {
        guard case .bool(let value) = self else { return nil }
        return value
    }
}
