import JSONCodec
import MicroHTTP

/// The API's error catalogue (RFC 9457 problem details): one stable `code` per kind of error.
/// Every handler answers errors through it, and the OpenAPI file lists the same codes.
public struct Problem: Error, Sendable, Equatable {
    public var code: String
    public var title: String
    public var status: Int
    public var detail: String
    public var extra: JSONObject = [:]

    public init(_ kind: Kind, _ detail: String, extra: JSONObject = [:]) {
        self.code = kind.rawValue
        self.title = kind.title
        self.status = kind.status
        self.detail = detail
        self.extra = extra
    }

    public enum Kind: String, Sendable, CaseIterable {
        case invalidJSON = "invalid_json"
        case validationFailed = "validation_failed"
        case notFound = "not_found"
        case methodNotAllowed = "method_not_allowed"
        case fileNotFound = "file_not_found"
        case fileIsDirectory = "file_is_directory"
        case fileNotRegular = "file_not_regular"
        case fileNotReadable = "file_not_readable"
        case fileOutsideAllowedRoots = "file_outside_allowed_roots"
        case fileNotWritable = "file_not_writable"
        case destinationExists = "destination_exists"
        case destinationNotAllowed = "destination_not_allowed"
        case unauthorized
        case forbidden
        case sessionExists = "session_exists"
        case conflict
        case transfersDisabled = "transfers_disabled"
        case payloadTooLarge = "payload_too_large"
        case tooManyTasks = "too_many_tasks"
        case insufficientStorage = "insufficient_storage"
        case internalError = "internal_error"
        case storeCorrupt = "store_corrupt"
        case unavailable = "service_unavailable"
        case stateUnavailable = "state_unavailable"

        public var status: Int {
            switch self {
            case .invalidJSON: return 400
            case .validationFailed, .fileNotFound, .fileIsDirectory, .fileNotRegular, .fileNotReadable, .fileNotWritable:
                return 422
            case .notFound: return 404
            case .methodNotAllowed: return 405
            case .fileOutsideAllowedRoots, .forbidden, .destinationNotAllowed: return 403
            case .unauthorized: return 401
            case .sessionExists, .conflict, .transfersDisabled, .destinationExists: return 409
            case .payloadTooLarge: return 413
            case .tooManyTasks: return 429
            case .insufficientStorage: return 507
            case .internalError, .storeCorrupt: return 500
            case .unavailable, .stateUnavailable: return 503
            }
        }

        public var title: String {
            switch self {
            case .invalidJSON: return "The body is not valid JSON"
            case .validationFailed: return "The request does not fit the API"
            case .notFound: return "No such resource"
            case .methodNotAllowed: return "Method not allowed on this resource"
            case .fileNotFound: return "The file does not exist"
            case .fileIsDirectory: return "The file is a directory"
            case .fileNotRegular: return "The file is not a regular file"
            case .fileNotReadable: return "The file cannot be read"
            case .fileOutsideAllowedRoots: return "The file is outside the allowed roots"
            case .fileNotWritable: return "The destination cannot be written"
            case .destinationExists: return "A file is already at the destination"
            case .destinationNotAllowed: return "The destination is not allowed"
            case .unauthorized: return "Authentication required"
            case .forbidden: return "Not allowed"
            case .sessionExists: return "The session exists with another configuration"
            case .conflict: return "The resource's state does not allow this"
            case .transfersDisabled: return "Transfers are disabled by the service policy"
            case .payloadTooLarge: return "The request body is too large"
            case .tooManyTasks: return "The session holds as many open tasks as it may"
            case .insufficientStorage: return "The state storage is full"
            case .internalError: return "Internal error"
            case .storeCorrupt: return "A stored record cannot be read"
            case .unavailable: return "The service is not ready"
            case .stateUnavailable: return "The state could not be made durable"
            }
        }
    }

    public var json: JSON {
        var object: JSONObject = [
            "type": .string("https://backhaul.dev/problems/\(code)"), "title": .string(title),
            "status": .int(Int64(status)), "detail": .string(detail), "code": .string(code),
        ]
        for (key, value) in extra { object[key] = value }
        return .object(object)
    }

    public var response: HTTPResponse {
        var headers = [("Content-Type", "application/problem+json")]
        if status == 405, let allow = extra["allow"]?.stringValue { headers.append(("Allow", allow)) }
        if status == 401 { headers.append(("WWW-Authenticate", "Bearer realm=\"backhaul\"")) }
        return HTTPResponse(status: status, headers: headers, body: json.serializedBytes())
    }
}
