/// A task's failure (OpenAPI/backhaul.yaml): a code following the phone OS's URL-error numbering.
public struct TaskError: Sendable, Equatable, Error {
    public var code: Int
    public var name: String
    public var message: String
    public var httpStatus: Int?
    /// A stable word for what, within the code, went wrong (`location_host_not_allowed`,
    /// `credentials_expired`), for clients that act on it; nil when the code says enough.
    public var reason: Reason?

    public init(_ kind: Kind, message: String, httpStatus: Int? = nil, reason: Reason? = nil) {
        self.code = kind.rawValue
        self.name = kind.name
        self.message = message
        self.httpStatus = httpStatus
        self.reason = reason
    }

    public init(code: Int, name: String, message: String, httpStatus: Int?, reason: Reason? = nil) {
        self.code = code
        self.name = name
        self.message = message
        self.httpStatus = httpStatus
        self.reason = reason
    }

    /// The reasons of docs/credentials.md, in one place.
    public struct Reason: RawRepresentable, Sendable, Hashable, ExpressibleByStringLiteral {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public init(stringLiteral value: String) { rawValue = value }

        /// A server-given `Location` named a host the upload allow-list does not admit.
        public static let locationHostNotAllowed: Reason = "location_host_not_allowed"
        /// The server said the task's credentials or signed URL expired (S3 `ExpiredToken`,
        /// `AccessDenied` "Request has expired", `TokenRefreshRequired`).
        public static let credentialsExpired: Reason = "credentials_expired"
        /// The server answered 401.
        public static let unauthorized: Reason = "unauthorized"
        /// The session's signer answered 4xx: it will not sign the task's request (`-1013`).
        public static let signerRefused: Reason = "signer_refused"
        /// The session's signer answered 200 with JSON that names no usable URL, method, headers
        /// or `expires_at` (`-1011`).
        public static let signerInvalidAnswer: Reason = "signer_invalid_answer"
        /// The task's path no longer leads to its file (`-4001`): a directory in it was swapped for
        /// a symbolic link, or the name now names another file (docs/security.md).
        public static let pathChanged: Reason = "path_changed"
    }

    /// The OpenAPI/backhaul.yaml table, in one place.
    public enum Kind: Int, Sendable, CaseIterable {
        /// The service itself could not carry the task out (its stored configuration cannot be
        /// applied, say); the message says what.
        case unknown = -1
        case cancelled = -999
        case timedOut = -1001
        case cannotFindHost = -1003
        case cannotConnectToHost = -1004
        case networkConnectionLost = -1005
        case notConnectedToInternet = -1009
        case badServerResponse = -1011
        case userAuthenticationRequired = -1013
        case dataNotAllowed = -1020
        case fileDoesNotExist = -1100
        case noPermissionsToReadFile = -1102
        case dataLengthExceedsMaximum = -1103
        case secureConnectionFailed = -1200
        case cannotCreateFile = -3000
        case cannotWriteToFile = -3003
        /// A completed task's file could not be removed (`delete_file_on_success`): only ever its
        /// `last_error`, the task stays completed.
        case cannotRemoveFile = -3004
        case cannotMoveFile = -3005
        case downloadChecksumMismatch = -3006
        /// The task's protocol state is one its own rules cannot reach (a stored checkpoint that
        /// counts acknowledged bytes but names no upload, an IETF upload resource without its
        /// interop version): the task fails rather than the daemon (docs/operations.md).
        case internalError = -3100
        case fileChanged = -4001

        public var name: String {
            switch self {
            case .unknown: return "unknown"
            case .cancelled: return "cancelled"
            case .timedOut: return "timed_out"
            case .cannotFindHost: return "cannot_find_host"
            case .cannotConnectToHost: return "cannot_connect_to_host"
            case .networkConnectionLost: return "network_connection_lost"
            case .notConnectedToInternet: return "not_connected_to_internet"
            case .badServerResponse: return "bad_server_response"
            case .userAuthenticationRequired: return "user_authentication_required"
            case .dataNotAllowed: return "data_not_allowed"
            case .fileDoesNotExist: return "file_does_not_exist"
            case .noPermissionsToReadFile: return "no_permissions_to_read_file"
            case .dataLengthExceedsMaximum: return "data_length_exceeds_maximum"
            case .secureConnectionFailed: return "secure_connection_failed"
            case .cannotCreateFile: return "cannot_create_file"
            case .cannotWriteToFile: return "cannot_write_to_file"
            case .cannotRemoveFile: return "cannot_remove_file"
            case .cannotMoveFile: return "cannot_move_file"
            case .downloadChecksumMismatch: return "download_checksum_mismatch"
            case .internalError: return "internal_error"
            case .fileChanged: return "file_changed"
            }
        }
    }
}

/// Why a task was cancelled (OpenAPI/backhaul.yaml), with the phone OS's values.
public enum CancellationReason: Int, Sendable, CaseIterable {
    case userCancelled = 0
    case backgroundUpdatesDisabled = 1
    case insufficientSystemResources = 2

    public var name: String {
        switch self {
        case .userCancelled: return "user_cancelled"
        case .backgroundUpdatesDisabled: return "background_updates_disabled"
        case .insufficientSystemResources: return "insufficient_system_resources"
        }
    }
}
