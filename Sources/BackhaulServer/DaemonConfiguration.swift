import BackhaulAPI
import BackhaulCore
import BackhaulEngine
import BackhaulQueue
import BackhaulSQLite
import JSONCodec

/// The daemon's configuration: defaults, then the config file, then `BACKHAUL_*` variables,
/// then command-line flags, each overriding the one before.
///
/// Every setting is declared once, in the table `DaemonConfiguration.Settings`
/// (DaemonConfiguration+Settings.swift): its flag, variable, file key, default, checks, help and
/// what `/v1/info` shows. Resolving (DaemonConfiguration+Resolve.swift), the usage text and the
/// README table (DaemonConfiguration+Text.swift) and `infoJSON` are derived from it; the
/// properties below take their defaults from it.
public struct DaemonConfiguration: Sendable {
    public var listenHost = Settings.listen.defaultValue.host
    public var listenPort = Settings.listen.defaultValue.port
    public var stateDirectory = Settings.stateDirectory.defaultValue
    /// A `postgres://` URL: the state is in PostgreSQL, shared with the fleet (docs/fleet.md).
    public var stateURL = Settings.stateURL.defaultValue
    /// This node's id in the fleet; nil: the host name.
    public var nodeID = Settings.nodeID.defaultValue
    public var leaseSeconds = Settings.leaseSeconds.defaultValue
    /// Directories every node of the fleet sees.
    public var sharedRoots = Settings.sharedRoots.defaultValue
    public var allowedRoots: [String]
    public var configFile = Settings.configFile.defaultValue
    public var logLevel = Settings.logLevel.defaultValue
    public var maxBodyBytes = Settings.maxBodyBytes.defaultValue
    public var maxConcurrentTransfers = Settings.maxTransfers.defaultValue
    /// Unfinished tasks one session may hold.
    public var maxOpenTasksPerSession = Settings.maxOpenTasks.defaultValue
    public var shutdownGraceSeconds = Settings.shutdownGrace.defaultValue
    public var caBundle = Settings.caBundle.defaultValue
    /// Delays before each webhook delivery attempt, seconds (the first is the initial one).
    public var webhookRetrySchedule = Settings.webhookRetrySchedule.defaultValue
    /// Seconds between `task.progress` events of one running task.
    public var progressInterval = Settings.progressInterval.defaultValue
    /// Seconds between the engine's hand-overs of its writes while many transfers run.
    public var writePacing = Settings.writePacing.defaultValue
    /// Network detection: the routing table, how often it is read, how interfaces are classified.
    public var routeFile = Settings.routeFile.defaultValue
    public var networkSource = Settings.networkSource.defaultValue
    public var networkCheckInterval = Settings.network.defaultValue.checkInterval
    public var classifier = Settings.network.defaultValue.classifier
    /// The service policy (config file `policy`; `PUT /v1/policy` replaces it at run time).
    public var policy = Settings.policy.defaultValue
    /// Bearer tokens (`--token-file`, `BACKHAUL_TOKENS`); nil: no authentication, loopback only.
    public var tokens = Settings.tokens.defaultValue?.tokens
    public var tokenFile = Settings.tokens.defaultValue?.file
    /// Upload and webhook host allow-lists and the private-address switch.
    public var destinations = DestinationRules()
    /// Whether the AWS credential chain may ask EC2's IMDSv2 (docs/credentials.md).
    public var awsIMDS = false
    /// Serve the dashboard at `/` (`--no-ui`, `BACKHAUL_UI=0` or config `"ui": false` turn it off).
    public var dashboard = Settings.ui.defaultValue
    /// Seconds a finished task is kept before it is removed (`--finished-task-retention`).
    public var finishedTaskRetention = Settings.finishedTaskRetention.defaultValue
    /// What a damaged state database gets at start: salvaged, or refused (exit 65).
    public var onCorruptState = Settings.onCorruptState.defaultValue
    /// The state's write-ahead log's hard cap, in frames (`WALPolicy.capFrames`).
    public var walCapFrames = Settings.walCapFrames.defaultValue

    public init(workingDirectory: String) {
        allowedRoots = [workingDirectory]
        destinations.uploadHosts = Settings.uploadHosts.defaultValue
        destinations.webhookHosts = Settings.webhookHosts.defaultValue
        destinations.denyPrivate = Settings.denyPrivateDestinations.defaultValue
        awsIMDS = Settings.awsIMDS.defaultValue
    }

    public var listen: String { listenAddress.text }

    /// Without tokens the daemon serves loopback only (OpenAPI/backhaul.yaml).
    public var isLoopback: Bool { listenHost.hasPrefix("127.") || listenHost == "::1" }

    /// What `/v1/info` shows: each setting as its table entry says, secrets only as a summary.
    public var infoJSON: JSONObject {
        var object = JSONObject()
        for setting in Settings.all {
            if let (key, value) = setting.info(self) { object[key] = value }
        }
        return object
    }

    public struct Invalid: Error, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// What the command line asked for besides running.
    public enum Action: Sendable, Equatable { case run, help, version }
}

/// The properties some settings are made of, as one value each.
extension DaemonConfiguration {
    var listenAddress: ListenAddress {
        get { ListenAddress(host: listenHost, port: listenPort) }
        set {
            listenHost = newValue.host
            listenPort = newValue.port
        }
    }

    var tokenSetting: TokenSetting? {
        get { tokens.map { TokenSetting(tokens: $0, file: tokenFile) } }
        set {
            tokens = newValue?.tokens
            tokenFile = newValue?.file
        }
    }

    var networkDetection: NetworkDetection {
        get { NetworkDetection(classifier: classifier, checkInterval: networkCheckInterval) }
        set {
            classifier = newValue.classifier
            networkCheckInterval = newValue.checkInterval
        }
    }
}
