import JSONValue

/// How transient failures are retried (OpenAPI/backhaul.yaml `retry`).
public struct RetryPolicy: Sendable, Equatable {
    /// nil: retry until the resource timeout.
    public var maxAttempts: Int?
    public var initialBackoff: Double
    public var maxBackoff: Double

    public init(maxAttempts: Int? = nil, initialBackoff: Double = 2, maxBackoff: Double = 600) {
        self.maxAttempts = maxAttempts
        self.initialBackoff = initialBackoff
        self.maxBackoff = maxBackoff
    }
}

/// A session's background configuration (OpenAPI/backhaul.yaml); a task may override any field.
public struct TransferConfiguration: Sendable, Equatable {
    public var allowsCellularAccess = true
    public var allowsExpensiveNetworkAccess = true
    public var allowsConstrainedNetworkAccess = true
    /// false: a roaming network holds the task (`roaming_not_allowed`), whatever
    /// `allowsExpensiveNetworkAccess` says (docs/network.md).
    public var allowsRoaming = true
    public var discretionary = false
    /// How the task shares the link; nil: not set, and the service policy decides
    /// (`ServicePolicy.networkServiceType(for:)`).
    public var networkServiceType: NetworkServiceType?
    public var waitsForConnectivity = true
    public var timeoutIntervalForRequest: Double = 60
    public var timeoutIntervalForResource: Double = 604_800
    public var maxConnectionsPerHost = 6
    public var retry = RetryPolicy()
    public var defaultHeaders: [(String, String)] = []
    /// The most bytes (sum of file sizes) a session's unfinished tasks may hold; a task past it is
    /// cancelled with reason 2 as it is created. Read from the session's configuration only.
    public var quotaBytes: Int64?
    /// How long the session's finished tasks are kept (seconds from `finished_at`); nil: the
    /// daemon's `--finished-task-retention`. Read from the session's configuration only.
    public var finishedTaskRetention: Double?
    /// The session's signer (docs/credentials.md), asked for each request's URL. Read from the
    /// session's configuration only (a task cannot name one).
    public var signer: SignerConfiguration?

    public init() {}

    /// Field by field; default headers as a set of name-value pairs (their order does not matter).
    public static func == (lhs: TransferConfiguration, rhs: TransferConfiguration) -> Bool {
        lhs.allowsCellularAccess == rhs.allowsCellularAccess
            && lhs.allowsExpensiveNetworkAccess == rhs.allowsExpensiveNetworkAccess
            && lhs.allowsConstrainedNetworkAccess == rhs.allowsConstrainedNetworkAccess && lhs.allowsRoaming == rhs.allowsRoaming
            && lhs.discretionary == rhs.discretionary && lhs.networkServiceType == rhs.networkServiceType
            && lhs.waitsForConnectivity == rhs.waitsForConnectivity
            && lhs.timeoutIntervalForRequest == rhs.timeoutIntervalForRequest
            && lhs.timeoutIntervalForResource == rhs.timeoutIntervalForResource
            && lhs.maxConnectionsPerHost == rhs.maxConnectionsPerHost
            && lhs.retry == rhs.retry && lhs.quotaBytes == rhs.quotaBytes
            && lhs.finishedTaskRetention == rhs.finishedTaskRetention && lhs.signer == rhs.signer
            && HeaderRules.sameSet(lhs.defaultHeaders, rhs.defaultHeaders)
    }

    static let fields: Set<String> = [
        "allows_cellular_access", "allows_expensive_network_access", "allows_constrained_network_access",
        "allows_roaming", "discretionary", "network_service_type", "waits_for_connectivity", "timeout_interval_for_request",
        "timeout_interval_for_resource", "max_connections_per_host", "retry", "default_headers",
        "quota_bytes", "finished_task_retention", "signer",
    ]

    /// This configuration with the fields present in `overrides` replaced (retry and default
    /// headers merge member by member). Throws for unknown fields and out-of-range values.
    public func applying(_ overrides: JSON, path: String = "configuration") throws(ValidationError) -> TransferConfiguration {
        let reader = try FieldReader(overrides, path: path)
        try reader.rejectUnknown(Self.fields)
        var result = self
        if let value = try reader.bool("allows_cellular_access") { result.allowsCellularAccess = value }
        if let value = try reader.bool("allows_expensive_network_access") { result.allowsExpensiveNetworkAccess = value }
        if let value = try reader.bool("allows_constrained_network_access") { result.allowsConstrainedNetworkAccess = value }
        if let value = try reader.bool("allows_roaming") { result.allowsRoaming = value }
        if let value = try reader.bool("discretionary") { result.discretionary = value }
        if reader.has("network_service_type") { result.networkServiceType = try reader.serviceType("network_service_type") }
        if let value = try reader.bool("waits_for_connectivity") { result.waitsForConnectivity = value }
        if let value = try reader.number("timeout_interval_for_request", in: 0.1...86_400) {
            result.timeoutIntervalForRequest = value
        }
        if let value = try reader.number("timeout_interval_for_resource", in: 0.1...31_536_000) {
            result.timeoutIntervalForResource = value
        }
        if let value = try reader.integer("max_connections_per_host", in: 1...256) {
            result.maxConnectionsPerHost = Int(value)
        }
        if let retry = try reader.object("retry") {
            try retry.rejectUnknown(["max_attempts", "initial_backoff", "max_backoff"])
            if retry.has("max_attempts") {
                result.retry.maxAttempts = try retry.integer("max_attempts", in: 1...1_000_000).map { Int($0) }
            }
            if let value = try retry.number("initial_backoff", in: 0...86_400) { result.retry.initialBackoff = value }
            if let value = try retry.number("max_backoff", in: 0...86_400) { result.retry.maxBackoff = value }
            if result.retry.maxBackoff < result.retry.initialBackoff {
                throw ValidationError(retry.field("max_backoff"), "must not be less than initial_backoff")
            }
        }
        if reader.has("quota_bytes") { result.quotaBytes = try reader.integer("quota_bytes", in: 0...(1 << 60)) }
        if reader.has("finished_task_retention") {
            result.finishedTaskRetention = try reader.number("finished_task_retention", in: 1...(10 * 366 * 86_400))
        }
        if reader.has("signer") {
            let signer = try reader.object("signer")
            result.signer = nil
            if let signer { result.signer = try SignerConfiguration.read(signer) }
        }
        if let headers = try reader.stringMap("default_headers") {
            for (name, value) in headers {
                try HeaderRules.validate(name: name, value: value, field: reader.field("default_headers"))
                result.defaultHeaders.removeAll { $0.0.lowercased() == name.lowercased() }
                result.defaultHeaders.append((name, value))
            }
        }
        return result
    }

    /// The configuration as the API shows it; default headers redacted when asked.
    public func json(redacted: Bool = false) -> JSON {
        var retry: JSONObject = [:]
        retry["max_attempts"] = self.retry.maxAttempts.map { .int(Int64($0)) } ?? .null
        retry["initial_backoff"] = .double(self.retry.initialBackoff)
        retry["max_backoff"] = .double(self.retry.maxBackoff)
        var object: JSONObject = [:]
        object["allows_cellular_access"] = .bool(allowsCellularAccess)
        object["allows_expensive_network_access"] = .bool(allowsExpensiveNetworkAccess)
        object["allows_constrained_network_access"] = .bool(allowsConstrainedNetworkAccess)
        object["allows_roaming"] = .bool(allowsRoaming)
        object["discretionary"] = .bool(discretionary)
        object["network_service_type"] = networkServiceType.map { .string($0.rawValue) } ?? .null
        object["waits_for_connectivity"] = .bool(waitsForConnectivity)
        object["timeout_interval_for_request"] = .double(timeoutIntervalForRequest)
        object["timeout_interval_for_resource"] = .double(timeoutIntervalForResource)
        object["max_connections_per_host"] = .int(Int64(maxConnectionsPerHost))
        object["retry"] = .object(retry)
        object["default_headers"] = HeaderRules.json(defaultHeaders, redacted: redacted)
        object["quota_bytes"] = quotaBytes.map { .int($0) } ?? .null
        object["finished_task_retention"] = finishedTaskRetention.map { .double($0) } ?? .null
        object["signer"] = signer?.json(redacted: redacted) ?? .null
        return .object(object)
    }

    /// The stored (unredacted) form; `applying` reads it back.
    public var json: JSON { json(redacted: false) }
}
