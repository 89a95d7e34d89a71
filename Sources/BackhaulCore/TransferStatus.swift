/// The build's version.
public enum BackhaulVersion {
    public static let string = "0.2.0"
}

/// What the transfer engine shows of itself to the API, declared here so the API depends on this
/// and not on the engine: live figures of running tasks, hosts at their connection limit, the
/// network it detects, its counters.
public protocol TransferStatus: Sendable {
    /// Live figures of a running task.
    func liveProgress(taskID: String) -> LiveProgress?
    /// Whether queued tasks of this session and host are held by `max_connections_per_host`.
    func isHostSaturated(sessionID: String, hostKey: String) -> Bool
    /// The engine runs (and has not been asked to stop).
    var isRunning: Bool { get }
    var metrics: EngineMetrics { get }
    /// The network as detected (not overridden); `refresh` reads the routing table now.
    func detectedNetwork(refresh: Bool) -> NetworkState
}

/// What the engine counts, for `/metrics` (counters since the daemon started).
public struct EngineMetrics: Sendable, Equatable {
    public var running = 0
    /// Request body bytes sent, by the network type they went over.
    public var bytesSentByNetwork: [NetworkType: Int64] = [:]
    public var bytesReceivedByNetwork: [NetworkType: Int64] = [:]
    /// Running transfers the policy stopped, by the waiting reason (or `failed`).
    public var policyStops: [String: Int] = [:]
    /// Attempts that failed and were retried, by kind of failure (one of `retryReasons`).
    public var retries: [String: Int] = [:]
    /// Kinds of retried failures, a closed set for metric labels.
    public static let retryReasons = [
        "http_408", "http_425", "http_429", "http_4xx", "http_5xx", "timed_out", "cannot_connect", "cannot_find_host",
        "connection_lost", "checksum_mismatch", "credentials_expired", "other",
    ]
    /// Questions to a session's signer, by what its answer meant (one of `signerOutcomes`).
    public var signerRequests: [String: Int] = [:]
    /// What a signer's answer meant, a closed set for metric labels: `ok` (a signature that was
    /// used), `transient` (retried: no answer, 5xx, 408, 429, not JSON), `refused` (another 4xx),
    /// `invalid` (JSON that cannot be used, or a URL outside the upload allow-list).
    public static let signerOutcomes = ["ok", "transient", "refused", "invalid"]
    /// The bandwidth limit in force (bytes/s), nil when there is none.
    public var bandwidthLimit: Int64?
    /// The rate background transfers pace at, summed over their paths (bytes/s; 0: none runs).
    public var backgroundRate: Int64 = 0
    /// The largest queueing delay a background path's controller measures (seconds).
    public var queueDelay: Double = 0
    /// What is left today of each discretionary budget.
    public var budgetRemaining: [NetworkType: Int64] = [:]
    /// Things the engine could not do and logged as errors, by kind (one of `Fault`).
    public var faults: [String: Int] = [:]
    /// Tasks waiting in the engine's queue.
    public var queued = 0

    /// Kinds of engine faults, a closed set for metric labels.
    public enum Fault: String, Sendable, CaseIterable {
        /// A read of the store failed (the work it was for is tried again on the next turn).
        case storeRead = "store_read"
        /// A write of the store failed.
        case storeWrite = "store_write"
        /// A task's own configuration could not be applied over its session's (the task failed).
        case invalidConfiguration = "invalid_configuration"
        /// A stored record could not be read back.
        case corruptRecord = "corrupt_record"
        /// curl refused an option.
        case curl
        /// A task's protocol state was one that should be impossible (the task failed -3100).
        case internalError = "internal_error"
    }

    public init() {}
}
