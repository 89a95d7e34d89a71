import BackhaulAPI
import BackhaulCore
import BackhaulEngine
import BackhaulFiles
import BackhaulQueue
import BackhaulSQLite
import JSONCodec

/// The settings table: every setting of the daemon, declared once. The order is the order of
/// the usage text, `/v1/info` and the README's Configuration table.
extension DaemonConfiguration {
    enum Settings {
        static let all: [any AnySetting] = [
            listen, stateDirectory, stateURL, nodeID, leaseSeconds, sharedRoots, allowedRoots, configFile, logLevel, maxTransfers,
            maxBodyBytes, shutdownGrace, caBundle,
            webhookRetrySchedule, progressInterval, writePacing, routeFile, networkSource, tokens, uploadHosts, webhookHosts,
            denyPrivateDestinations, awsIMDS,
            maxOpenTasks, finishedTaskRetention, onCorruptState, walCapFrames, ui, network, policy,
        ]

        static let listen: Setting<ListenAddress> = Setting(
            "listen", flag: FlagSpelling("--listen", "HOST:PORT"), environment: EnvironmentSpelling("BACKHAUL_LISTEN"),
            file: FileSpelling("listen"), default: ListenAddress(host: "127.0.0.1", port: 8427),
            help: "address to serve the API on (a numeric IP or localhost; port 0 picks one)", value: ListenAddress.value,
            property: \.listenAddress)

        static let stateDirectory: Setting<String> = Setting(
            "state_dir", flag: FlagSpelling("--state-dir", "DIR"), environment: EnvironmentSpelling("BACKHAUL_STATE_DIR"),
            file: FileSpelling("state_dir"), default: "./backhaul-state", help: "where the SQLite state lives", value: .path,
            property: \.stateDirectory)

        /// The URL holds the database's password: `/v1/info` says only which store is in use.
        static let stateURL: Setting<String?> = Setting(
            "state_url", flag: FlagSpelling("--state", "URL"), environment: EnvironmentSpelling("BACKHAUL_STATE_URL"),
            file: FileSpelling("state_url"), default: nil, defaultText: "none: SQLite in the state directory",
            help: "a postgres://… URL: the state lives in PostgreSQL, shared by every node on it (docs/fleet.md)",
            value: SettingValue(
                text: { (text) throws(SettingError) in
                    guard text.hasPrefix("postgres://") || text.hasPrefix("postgresql://") else {
                        throw SettingError("must be a postgres:// or postgresql:// URL")
                    }
                    return text
                }, show: { _ in .null }),
            property: \.stateURL, info: .secret("state", { .string($0 == nil ? "sqlite" : "postgresql") }))

        static let nodeID: Setting<String?> = Setting(
            "node_id", flag: FlagSpelling("--node-id", "ID"), environment: EnvironmentSpelling("BACKHAUL_NODE_ID"),
            file: FileSpelling("node_id"), default: nil, defaultText: "the host name",
            help: "this daemon's name in the fleet (with --state postgres://…)",
            value: SettingValue(
                text: { (text) throws(SettingError) in
                    guard !text.isEmpty, text.count <= 128, text.allSatisfy({ !$0.isWhitespace && !$0.isNewline }) else {
                        throw SettingError("must be 1 to 128 characters without spaces")
                    }
                    return text
                }, show: { $0.map { .string($0) } ?? .null }),
            property: \.nodeID)

        static let leaseSeconds: Setting<Double> = Setting(
            "lease_seconds", flag: FlagSpelling("--lease-seconds", "SECONDS"),
            environment: EnvironmentSpelling("BACKHAUL_LEASE_SECONDS"), file: FileSpelling("lease_seconds"), default: 30,
            help: "how long a task stays this node's without a heartbeat before another node takes it over",
            value: .seconds(1, maximum: 3600), property: \.leaseSeconds)

        static let sharedRoots: Setting<[String]> = Setting(
            "shared_roots", flag: FlagSpelling("--shared-root", "DIR", repeatable: true),
            environment: EnvironmentSpelling("BACKHAUL_SHARED_ROOTS", note: "`:`-separated"),
            file: FileSpelling("shared_roots", note: "array"), default: [], defaultText: "none",
            help: "a directory every node sees (NFS, a shared volume): its tasks run on any node; others stay on theirs",
            value: .list(separator: ":", nonEmpty: "shared root") { (root) throws(SettingError) in
                guard root.hasPrefix("/") else { throw SettingError("shared roots must be absolute paths: \(root)") }
            }, property: \.sharedRoots)

        /// The default is the working directory, which `init(workingDirectory:)` puts in.
        static let allowedRoots: Setting<[String]> = Setting(
            "allowed_roots", flag: FlagSpelling("--allow-root", "DIR", repeatable: true),
            environment: EnvironmentSpelling("BACKHAUL_ALLOWED_ROOTS", note: "`:`-separated"),
            file: FileSpelling("allowed_roots", note: "array"), default: [], defaultText: "the working directory",
            help: "a directory files may be uploaded from and downloaded into (absolute)",
            value: .list(separator: ":", nonEmpty: "allowed root") { (root) throws(SettingError) in
                guard root.hasPrefix("/") else { throw SettingError("allowed roots must be absolute paths: \(root)") }
            }, property: \.allowedRoots)

        /// Read before every other setting (the resolver applies the file it names first).
        static let configFile: Setting<String?> = Setting(
            "config", flag: FlagSpelling("--config", "FILE"), environment: EnvironmentSpelling("BACKHAUL_CONFIG"), file: nil,
            default: nil, defaultText: "none", help: "a JSON configuration file with the keys below", value: .optionalPath,
            property: \.configFile, info: .hidden)

        static let logLevel: Setting<String> = Setting(
            "log_level", flag: FlagSpelling("--log-level", "LEVEL"), environment: EnvironmentSpelling("BACKHAUL_LOG_LEVEL"),
            file: FileSpelling("log_level"), default: "info", help: "trace, debug, info, notice, warning, error or critical",
            value: .oneOf(["trace", "debug", "info", "notice", "warning", "error", "critical"]), property: \.logLevel)

        static let maxTransfers: Setting<Int> = Setting(
            "max_transfers", flag: FlagSpelling("--max-transfers", "N"),
            environment: EnvironmentSpelling("BACKHAUL_MAX_TRANSFERS"),
            file: FileSpelling("max_transfers"), default: 16, help: "transfers running at once", value: .integer(1...1024),
            property: \.maxConcurrentTransfers)

        static let maxBodyBytes: Setting<Int> = Setting(
            "max_body_bytes", flag: FlagSpelling("--max-body-bytes", "N"),
            environment: EnvironmentSpelling("BACKHAUL_MAX_BODY_BYTES"),
            file: FileSpelling("max_body_bytes"), default: 16 << 20, help: "largest API request body",
            value: .integer(1024...Int.max),
            property: \.maxBodyBytes)

        static let shutdownGrace: Setting<Double> = Setting(
            "shutdown_grace", flag: FlagSpelling("--shutdown-grace", "SECONDS"),
            environment: EnvironmentSpelling("BACKHAUL_SHUTDOWN_GRACE"),
            file: FileSpelling("shutdown_grace"), default: 10, help: "how long SIGTERM waits for running transfers",
            value: .seconds(0, maximum: 3600), property: \.shutdownGraceSeconds)

        static let caBundle: Setting<String?> = Setting(
            "ca_bundle", flag: FlagSpelling("--ca-bundle", "FILE"), environment: EnvironmentSpelling("BACKHAUL_CA_BUNDLE"),
            file: FileSpelling("ca_bundle"), default: nil, defaultText: "the system's",
            help: "CA certificates for https destinations",
            value: .optionalPath, property: \.caBundle)

        static let webhookRetrySchedule: Setting<[Double]> = Setting(
            "webhook_retry_schedule", flag: FlagSpelling("--webhook-retry-schedule", "S,S,…"),
            environment: EnvironmentSpelling("BACKHAUL_WEBHOOK_RETRY_SCHEDULE"),
            file: FileSpelling("webhook_retry_schedule", note: "array"),
            default: DeliveryPlan.standardSchedule,
            help: "seconds before each webhook delivery attempt (the first is the initial one)",
            value: .delays(count: 1...50, maximum: 604_800), property: \.webhookRetrySchedule)

        static let progressInterval: Setting<Double> = Setting(
            "progress_interval", flag: FlagSpelling("--progress-interval", "SECONDS"),
            environment: EnvironmentSpelling("BACKHAUL_PROGRESS_INTERVAL"), file: FileSpelling("progress_interval"), default: 5,
            help: "task.progress events per running task at most this often", value: .seconds(0.1, maximum: 3600),
            property: \.progressInterval)

        static let writePacing: Setting<Double> = Setting(
            "write_pacing", flag: FlagSpelling("--write-pacing", "SECONDS"),
            environment: EnvironmentSpelling("BACKHAUL_WRITE_PACING"), file: FileSpelling("write_pacing"), default: 0.002,
            help: "while 4 or more transfers run, their starts and ends wait this long at most to share a commit (0: none)",
            value: .seconds(0, maximum: 1), property: \.writePacing)

        static let routeFile: Setting<String> = Setting(
            "route_file", flag: FlagSpelling("--route-file", "FILE"), environment: EnvironmentSpelling("BACKHAUL_ROUTE_FILE"),
            file: FileSpelling("network.route_file", aliases: ["route_file"]), default: "/proc/net/route",
            help: "the routing table the network is detected from", value: .path, property: \.routeFile)

        /// `--token-file` and `token_file` name a file of entries; `BACKHAUL_TOKENS` holds them.
        static let tokens: Setting<TokenSetting?> = Setting(
            "token_file", flag: FlagSpelling("--token-file", "FILE"),
            environment: EnvironmentSpelling("BACKHAUL_TOKENS", note: "entries separated by `;`"),
            file: FileSpelling("token_file"),
            default: nil, defaultText: "none: loopback only",
            help: "API bearer tokens, one \"TOKEN admin\" or \"TOKEN client SESSION-PATTERN…\" a line",
            value: SettingValue(text: TokenSetting.read(file:), show: { _ in .null }),
            environmentText: TokenSetting.parse(entries:),
            property: \.tokenSetting,
            info: .secret("authentication", { .string($0 == nil ? "off (loopback only)" : "bearer tokens") }))

        static let uploadHosts: Setting<[String]> = Setting(
            "upload_hosts", flag: FlagSpelling("--allow-upload-host", "P", repeatable: true), environment: nil,
            file: FileSpelling("upload_hosts", note: "array"), default: [], defaultText: "any host",
            help: "upload destinations allowed (host glob, optionally scheme://)", value: .list(),
            property: \.destinations.uploadHosts)

        static let webhookHosts: Setting<[String]> = Setting(
            "webhook_hosts", flag: FlagSpelling("--allow-webhook-host", "P", repeatable: true), environment: nil,
            file: FileSpelling("webhook_hosts", note: "array"), default: [], defaultText: "any host",
            help: "webhook receivers allowed (same form)", value: .list(), property: \.destinations.webhookHosts)

        static let denyPrivateDestinations: Setting<Bool> = Setting(
            "deny_private_destinations", flag: FlagSpelling("--deny-private-destinations", nil),
            environment: EnvironmentSpelling("BACKHAUL_DENY_PRIVATE_DESTINATIONS", note: "`1` or `true`"),
            file: FileSpelling("deny_private_destinations"), default: false, defaultText: "off",
            help: "refuse loopback, private and link-local destinations (checked on connect too)", value: .onOff,
            property: \.destinations.denyPrivate)

        static let awsIMDS: Setting<Bool> = Setting(
            "aws_imds", flag: FlagSpelling("--aws-imds", nil),
            environment: EnvironmentSpelling("BACKHAUL_AWS_IMDS", note: "`1` or `true`"), file: FileSpelling("aws_imds"),
            default: false, defaultText: "off",
            help:
                "let s3 tasks without keys take them from EC2 IMDSv2 (after the environment, web identity, files, container endpoint)",
            value: .onOff, property: \.awsIMDS)

        static let maxOpenTasks: Setting<Int> = Setting(
            "max_open_tasks", flag: FlagSpelling("--max-open-tasks", "N"), environment: nil, file: FileSpelling("max_open_tasks"),
            default: 1_000_000, help: "unfinished tasks one session may hold (more: 429)", value: .integer(1...Int.max),
            property: \.maxOpenTasksPerSession)

        static let networkSource: Setting<NetworkSourceMode> = Setting(
            "network_source", flag: FlagSpelling("--network-source", "SOURCE"),
            environment: EnvironmentSpelling("BACKHAUL_NETWORK_SOURCE"), file: FileSpelling("network_source"),
            default: .auto,
            help:
                "where the network is read: auto (NetworkManager on the system bus whenever it is there, else the routing table), networkmanager or routing-table (docs/network.md)",
            value: .oneOfCases, property: \.networkSource)

        static let onCorruptState: Setting<CorruptStatePolicy> = Setting(
            "on_corrupt_state", flag: FlagSpelling("--on-corrupt-state", "MODE"),
            environment: EnvironmentSpelling("BACKHAUL_ON_CORRUPT_STATE"), file: FileSpelling("on_corrupt_state"),
            default: .salvage,
            help:
                "a state database SQLite finds damaged: salvage (copy what can be read into a fresh one, keep the damaged files in corrupt-TIME/, start; exit 75 without room for the copy) or refuse (exit 65)",
            value: .oneOfCases, property: \.onCorruptState)

        static let ui: Setting<Bool> = Setting(
            "ui", flag: FlagSpelling("--no-ui", nil, negates: true),
            environment: EnvironmentSpelling("BACKHAUL_UI", note: "`0` or `false` turns it off"), file: FileSpelling("ui"),
            default: true, defaultText: "the dashboard is served at `/`",
            help: "do not serve the dashboard (the web page at /)", value: .onOff, property: \.dashboard)

        static let walCapFrames: Setting<Int> = Setting(
            "wal_cap_frames", flag: FlagSpelling("--wal-cap-frames", "N"), environment: nil, file: FileSpelling("wal_cap_frames"),
            default: WALPolicy().capFrames,
            help: "frames (4 KiB pages) the state's write-ahead log may reach before the writer empties it (64 MiB)",
            value: .integer(100...1_000_000), property: \.walCapFrames)

        static let finishedTaskRetention: Setting<Double> = Setting(
            "finished_task_retention", flag: FlagSpelling("--finished-task-retention", "SECONDS"),
            environment: EnvironmentSpelling("BACKHAUL_FINISHED_TASK_RETENTION"), file: FileSpelling("finished_task_retention"),
            default: 604_800, help: "how long a finished task is kept before it is removed (7 days)",
            value: .seconds(0, exclusive: true),
            property: \.finishedTaskRetention)

        static let network: Setting<NetworkDetection> = Setting(
            "network", flag: nil, environment: nil, file: FileSpelling("network", note: "interface patterns, `check_interval`"),
            default: NetworkDetection(), defaultText: "see docs/policy.md",
            help: "interface patterns, check_interval and route_file (docs/policy.md)", value: NetworkDetection.value,
            property: \.networkDetection, info: .summary("network_check_interval", { .double($0.checkInterval) }))

        static let policy: Setting<ServicePolicy> = Setting(
            "policy", flag: nil, environment: nil,
            file: FileSpelling("policy", note: "bandwidth, discretionary window and budgets, `transfers_enabled`"),
            default: ServicePolicy(),
            defaultText: "no limits", help: "the service policy (GET/PUT /v1/policy at run time; docs/policy.md)",
            value: SettingValue(
                text: { (_) throws(SettingError) in throw SettingError("is an object of the config file") },
                json: { (member) throws(SettingError) in
                    do { return try ServicePolicy().applying(member) } catch { throw SettingError("\(error)") }
                }, show: { $0.json }),
            property: \.policy, info: .hidden)
    }
}

/// `HOST:PORT` or `[IPv6]:PORT`; `localhost` is 127.0.0.1.
struct ListenAddress: Sendable, Equatable {
    var host: String
    var port: UInt16

    var text: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

    static let value = SettingValue<ListenAddress>(
        text: { (text) throws(SettingError) in
            guard let address = ListenAddress(text) else {
                throw SettingError("must be HOST:PORT with a numeric IP (or localhost)")
            }
            return address
        }, show: { .string($0.text) })

    init(host: String, port: UInt16) {
        self.host = host
        self.port = port
    }

    init?(_ value: String) {
        var host: Substring
        var portText: Substring
        if value.hasPrefix("[") {
            guard let close = value.firstIndex(of: "]") else { return nil }
            host = value[value.index(after: value.startIndex)..<close]
            let rest = value[value.index(after: close)...]
            guard rest.hasPrefix(":") else { return nil }
            portText = rest.dropFirst()
        } else {
            guard let colon = value.lastIndex(of: ":") else { return nil }
            host = value[..<colon]
            portText = value[value.index(after: colon)...]
        }
        guard let port = UInt16(portText), !host.isEmpty else { return nil }
        if host == "localhost" { host = "127.0.0.1" }
        self.init(host: String(host), port: port)
    }
}

/// The API's tokens and the file they came from (none when `BACKHAUL_TOKENS` gave them).
struct TokenSetting: Sendable {
    var tokens: AccessTokens
    var file: String?

    @Sendable static func read(file path: String) throws(SettingError) -> TokenSetting? {
        guard let text = SmallFile.read(path) else { throw SettingError("cannot read the token file \(path)") }
        do {
            return TokenSetting(tokens: try AccessTokens(parsing: String(decoding: text, as: UTF8.self)), file: path)
        } catch {
            throw SettingError("\(path): \(error)")
        }
    }

    @Sendable static func parse(entries: String) throws(SettingError) -> TokenSetting? {
        do { return TokenSetting(tokens: try AccessTokens(parsing: entries), file: nil) } catch { throw SettingError("\(error)") }
    }
}

/// The config file's `network` object: how interfaces are classified and how often the routing
/// table is read (its `route_file` is the `route_file` setting).
struct NetworkDetection: Sendable {
    var classifier = NetworkClassifier()
    var checkInterval = 1.0

    static let value = SettingValue<NetworkDetection>(
        text: { (_) throws(SettingError) in throw SettingError("is an object of the config file") },
        json: { (member) throws(SettingError) in
            var detection = NetworkDetection()
            do {
                try detection.classifier.apply(member)
                if let interval = member["check_interval"] {
                    guard let seconds = interval.doubleValue, seconds >= 0.1, seconds <= 3600 else {
                        throw ValidationError("network.check_interval", "must be 0.1 to 3600 seconds")
                    }
                    detection.checkInterval = seconds
                }
            } catch {
                throw SettingError("\(error)")
            }
            return detection
        }, show: { .double($0.checkInterval) })
}
