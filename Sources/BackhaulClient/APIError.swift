#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Why a call to the API gave no result: the API's refusal, a failed transport, or an answer this
/// client cannot read. Callers match the case and the problem's `code`, never the text.
public enum APIError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The API answered with an error status (its problem+json, RFC 9457).
    case problem(APIProblem)
    /// The daemon could not be reached, or the exchange broke before an answer.
    case transport(TransportFailure)
    /// A successful status whose body is not what the API promises (naming the member, as
    /// `tasks[2].progress.fraction`).
    case unexpectedAnswer(String)
    /// A request this client could not write (a number JSON cannot hold, say).
    case invalidRequest(String)

    public var description: String {
        switch self {
        case .invalidRequest(let what): return "cannot write the request: \(what)"
        case .problem(let problem): return problem.description
        case .transport(let failure): return failure.description
        case .unexpectedAnswer(let what): return "backhauld's answer is not what this client expects: \(what)"
        }
    }

    /// The problem's code when the API refused, else nil: `catch let error where error.code == .notFound`.
    public var code: ProblemCode? {
        guard case .problem(let problem) = self else { return nil }
        return problem.code
    }
}

/// A problem+json answer (OpenAPI/backhaul.yaml, `Problem`): the status, the stable `code` of the
/// API's catalogue, and the detail.
public struct APIProblem: Sendable, Equatable, Codable, CustomStringConvertible {
    public var status: Int
    /// Nil when the body was not a problem object (a proxy's error page, say).
    public var code: ProblemCode?
    public var title: String?
    public var detail: String
    /// The request member the problem is about (`validation_failed`), when the API names one.
    public var field: String?
    /// The problem type's URI.
    public var type: String?

    public init(
        status: Int, code: ProblemCode?, title: String? = nil, detail: String, field: String? = nil, type: String? = nil
    ) {
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.field = field
        self.type = type
    }

    /// Reads an error answer's body; a body that is not a problem object still gives the status.
    public init(status: Int, body: [UInt8]) {
        /// The members of a problem, each optional: a body may have any of them or none.
        struct Members: Decodable {
            var code: ProblemCode?
            var title: String?
            var detail: String?
            var field: String?
            var type: String?
        }
        let members = try? JSONDecoder().decode(Members.self, from: Data(body))
        self.init(
            status: status, code: members?.code, title: members?.title, detail: members?.detail ?? "HTTP \(status)",
            field: members?.field, type: members?.type)
    }

    /// `detail (code)`: what the command line prints.
    public var description: String { detail + (code.map { " (\($0.rawValue))" } ?? "") }
}

/// A `code` of the API's problem catalogue (OpenAPI/backhaul.yaml, `Problem`). A code this
/// client has no name for is still a code: compare it with `ProblemCode("…")`.
public struct ProblemCode: RawRepresentable, Hashable, Sendable, Codable, ExpressibleByStringLiteral {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public init(stringLiteral value: String) { rawValue = value }

    public init(from decoder: any Decoder) throws { rawValue = try decoder.singleValueContainer().decode(String.self) }
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }

    public static let invalidJSON: ProblemCode = "invalid_json"
    public static let validationFailed: ProblemCode = "validation_failed"
    public static let notFound: ProblemCode = "not_found"
    public static let methodNotAllowed: ProblemCode = "method_not_allowed"
    public static let fileNotFound: ProblemCode = "file_not_found"
    public static let fileIsDirectory: ProblemCode = "file_is_directory"
    public static let fileNotRegular: ProblemCode = "file_not_regular"
    public static let fileNotReadable: ProblemCode = "file_not_readable"
    public static let fileOutsideAllowedRoots: ProblemCode = "file_outside_allowed_roots"
    public static let fileNotWritable: ProblemCode = "file_not_writable"
    public static let destinationExists: ProblemCode = "destination_exists"
    public static let destinationNotAllowed: ProblemCode = "destination_not_allowed"
    public static let tooManyTasks: ProblemCode = "too_many_tasks"
    public static let unauthorized: ProblemCode = "unauthorized"
    public static let forbidden: ProblemCode = "forbidden"
    /// `PUT /v1/sessions/{id}`: the session exists with another configuration.
    public static let sessionExists: ProblemCode = "session_exists"
    public static let conflict: ProblemCode = "conflict"
    public static let transfersDisabled: ProblemCode = "transfers_disabled"
    public static let payloadTooLarge: ProblemCode = "payload_too_large"
    public static let insufficientStorage: ProblemCode = "insufficient_storage"
    public static let internalError: ProblemCode = "internal_error"
    public static let storeCorrupt: ProblemCode = "store_corrupt"
    public static let serviceUnavailable: ProblemCode = "service_unavailable"
    public static let stateUnavailable: ProblemCode = "state_unavailable"
}

/// The daemon could not be reached at `baseURL`, or the connection broke; `reason` is the
/// transport's own message (curl's).
public struct TransportFailure: Error, Sendable, Equatable, CustomStringConvertible {
    public var baseURL: String
    public var reason: String

    public init(baseURL: String, reason: String) {
        self.baseURL = baseURL
        self.reason = reason
    }

    public var description: String { "cannot reach backhauld at \(baseURL): \(reason)" }
}

extension DecodingError {
    /// Where the answer went wrong and how, in a line: `tasks[1].kind is not a string`.
    var summary: String {
        func path(_ keys: [any CodingKey]) -> String {
            var text = ""
            for key in keys {
                if let index = key.intValue { text += "[\(index)]" } else { text += (text.isEmpty ? "" : ".") + key.stringValue }
            }
            return text.isEmpty ? "the answer" : text
        }
        switch self {
        case .keyNotFound(let key, let context): return "\(path(context.codingPath + [key])) is missing"
        case .valueNotFound(let type, let context): return "\(path(context.codingPath)) is null, not \(Self.kind(type))"
        case .typeMismatch(let type, let context): return "\(path(context.codingPath)) is not \(Self.kind(type))"
        case .dataCorrupted(let context): return "\(path(context.codingPath)): \(context.debugDescription)"
        @unknown default: return "\(self)"
        }
    }

    private static func kind(_ type: Any.Type) -> String {
        switch type {
        case is String.Type: return "a string"
        case is Bool.Type: return "a boolean"
        case is Int.Type, is Int64.Type: return "an integer"
        case is Double.Type: return "a number"
        case is [Any].Type: return "an array"
        default: return type == [String: Any].self ? "an object" : "\(type)"
        }
    }
}
