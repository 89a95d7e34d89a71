import JSONCodec

/// Why a call to the API gave no result: the API's refusal, a failed transport, or an answer this
/// client cannot read. Callers match the case and the problem's `code`, never the text.
public enum APIError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The API answered with an error status (its problem+json, RFC 9457).
    case problem(APIProblem)
    /// The daemon could not be reached, or the exchange broke before an answer.
    case transport(TransportFailure)
    /// A successful status whose body is not what the API promises (`where` names the member).
    case unexpectedAnswer(String)

    public var description: String {
        switch self {
        case .problem(let problem): return problem.description
        case .transport(let failure): return failure.description
        case .unexpectedAnswer(let what): return "backhauld's answer is not what this client expects: \(what)"
        }
    }
}

/// A problem+json answer: the status, the stable `code` of the API's catalogue, and the detail.
public struct APIProblem: Sendable, Equatable, CustomStringConvertible {
    public var status: Int
    /// Nil when the body was not a problem object (a proxy's error page, say).
    public var code: ProblemCode?
    public var title: String?
    public var detail: String
    /// The request member the problem is about (`validation_failed`), when the API names one.
    public var field: String?

    public init(status: Int, code: ProblemCode?, title: String? = nil, detail: String, field: String? = nil) {
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.field = field
    }

    /// Reads an error answer's body; a body that is not a problem object still gives the status.
    public init(status: Int, body: [UInt8]) {
        let value = (try? JSON.parse(body, maxDepth: 16)) ?? .null
        self.init(
            status: status, code: value["code"]?.stringValue.map(ProblemCode.init(rawValue:)), title: value["title"]?.stringValue,
            detail: value["detail"]?.stringValue ?? "HTTP \(status)", field: value["field"]?.stringValue)
    }

    /// `detail (code)`: what the command line prints.
    public var description: String { detail + (code.map { " (\($0.rawValue))" } ?? "") }
}

/// A `code` of the API's problem catalogue. The client names the codes it acts on.
public struct ProblemCode: RawRepresentable, Hashable, Sendable, ExpressibleByStringLiteral {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(stringLiteral value: String) { rawValue = value }

    /// `PUT /v1/sessions/{id}`: the session exists with another configuration.
    public static let sessionExists: ProblemCode = "session_exists"
    public static let notFound: ProblemCode = "not_found"
    public static let validationFailed: ProblemCode = "validation_failed"
    public static let unauthorized: ProblemCode = "unauthorized"
    public static let forbidden: ProblemCode = "forbidden"
    public static let conflict: ProblemCode = "conflict"
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
