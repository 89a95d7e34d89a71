/// The life of a task (OpenAPI/backhaul.yaml).
public enum TaskState: String, Sendable, CaseIterable, Codable {
    case queued, waiting, running, retrying, suspended
    case authRequired = "auth_required"
    case completed, failed, cancelled

    public var isFinal: Bool { self == .completed || self == .failed || self == .cancelled }

    public static let unfinished: [TaskState] = allCases.filter { !$0.isFinal }
}

/// Why a `waiting` task is held (OpenAPI/backhaul.yaml).
public enum WaitingReason: String, Sendable, CaseIterable {
    case noConnectivity = "no_connectivity"
    /// Connected, but NetworkManager sees a captive portal or no way to the internet.
    case limitedConnectivity = "limited_connectivity"
    case roamingNotAllowed = "roaming_not_allowed"
    case cellularNotAllowed = "cellular_not_allowed"
    case expensiveNetworkNotAllowed = "expensive_network_not_allowed"
    case constrainedNetworkNotAllowed = "constrained_network_not_allowed"
    case discretionaryDeferred = "discretionary_deferred"
    case budgetExhausted = "budget_exhausted"
    case scheduled
    case hostConnectionLimit = "host_connection_limit"
    case sessionFinishing = "session_finishing"
    case sessionDisabled = "session_disabled"
    /// The task is pinned to a node of the fleet that is down (docs/fleet.md).
    case nodeUnavailable = "node_unavailable"
    /// An `s3` task that signs with the daemon's AWS credential chain, whose keys are not there
    /// yet: its source is being asked, or waits out a backoff after failing (docs/credentials.md).
    /// `aws_credentials` while the chain has not yet named the source it asks; then the source's.
    case awsCredentials = "aws_credentials"
    case awsCredentialsWebIdentity = "aws_credentials_web_identity"
    case awsCredentialsProcess = "aws_credentials_process"
    case awsCredentialsContainer = "aws_credentials_container"
    case awsCredentialsIMDS = "aws_credentials_imds"

    /// The reasons of a task waiting for the AWS credential chain.
    public static let awsCredentialReasons: Set<WaitingReason> = [
        .awsCredentials, .awsCredentialsWebIdentity, .awsCredentialsProcess, .awsCredentialsContainer, .awsCredentialsIMDS,
    ]

    /// The reason of a task waiting for keys from `source` (nil: not named yet).
    public static func awsCredentials(from source: AWSCredentialSource?) -> WaitingReason {
        switch source {
        case .webIdentity: return .awsCredentialsWebIdentity
        case .process: return .awsCredentialsProcess
        case .container: return .awsCredentialsContainer
        case .imds: return .awsCredentialsIMDS
        case nil: return .awsCredentials
        }
    }
}

/// What a client asks of one task through the API.
public enum TaskCommand: String, Sendable {
    case cancel, suspend, resume
}

/// Why a transition (a client command, an engine report, a timer) does not apply to a task in
/// its state: `input` names it in words ("cancel", "end an attempt").
public struct TransitionRefused: Error, Sendable, Equatable {
    public var state: TaskState
    public var input: String

    public init(state: TaskState, input: String) {
        self.state = state
        self.input = input
    }
}

extension TaskState {
    /// The state a client command leads to, or why it is refused. Pure: the engine and the
    /// API both use it, so the rules live in one place.
    public func applying(_ command: TaskCommand) -> Result<TaskState, TransitionRefused> {
        switch (command, self) {
        case (_, .completed), (_, .failed), (_, .cancelled):
            return .failure(TransitionRefused(state: self, input: command.rawValue))
        case (.cancel, _):
            return .success(.cancelled)
        case (.suspend, .suspended):
            return .success(.suspended)
        case (.suspend, _):
            return .success(.suspended)
        case (.resume, .suspended):
            return .success(.queued)
        case (.resume, _):
            return .failure(TransitionRefused(state: self, input: command.rawValue))
        }
    }
}
