import BackhaulAPI
import BackhaulFiles
import BackhaulCore
import Glibc
import JSON

/// The daemon's configuration: defaults, then the config file, then `BACKHAUL_*` variables,
/// then command-line flags, each overriding the one before.
public struct DaemonConfiguration: Sendable {
    /// How long finished tasks are kept (SPEC §4.4); set by the settings table.
    public var finishedTaskRetention: Double = 7 * 86_400
    public var listenHost = "127.0.0.1"
    public var listenPort: UInt16 = 8427
    public var stateDirectory = "./backhaul-state"
    public var allowedRoots: [String]
    public var configFile: String?
    public var logLevel = "info"
    public var maxBodyBytes = 16 << 20
    public var maxConcurrentTransfers = 16
    /// Unfinished tasks one session may hold.
    public var maxOpenTasksPerSession = 1_000_000
    public var shutdownGraceSeconds = 10.0
    public var caBundle: String?
    /// Delays before each webhook delivery attempt, seconds (the first is the initial one).
    public var webhookRetrySchedule: [Double] = DeliveryPlan.standardSchedule
    /// Seconds between `task.progress` events of one running task.
    public var progressInterval = 5.0
    /// Network detection: the routing table, how often it is read, how interfaces are classified.
    public var routeFile = "/proc/net/route"
    public var networkCheckInterval = 1.0
    public var classifier = NetworkClassifier()
    /// The service policy (config file `policy`; `PUT /v1/policy` replaces it at run time).
    public var policy = ServicePolicy()
    /// Bearer tokens (`--token-file`, `BACKHAUL_TOKENS`); nil: no authentication, loopback only.
    public var tokens: AccessTokens?
    public var tokenFile: String?
    /// Upload and webhook host allow-lists and the private-address switch.
    public var destinations = DestinationRules()
    /// Serve the dashboard at `/` (`--no-ui`, `BACKHAUL_UI=0` or config `"ui": false` turn it off).
    public var dashboard = true

    public init(workingDirectory: String) { allowedRoots = [workingDirectory] }

    public var listen: String {
        listenHost.contains(":") ? "[\(listenHost)]:\(listenPort)" : "\(listenHost):\(listenPort)"
    }

    public static let usage = """
        usage: backhauld [options]
          --listen HOST:PORT       address to serve the API on (default 127.0.0.1:8427; port 0 picks one)
          --state-dir DIR          where the SQLite state lives (default ./backhaul-state)
          --allow-root DIR         a directory files may be uploaded from (repeatable; default the working directory)
          --config FILE            a JSON configuration file
          --log-level LEVEL        trace, debug, info, notice, warning, error, critical (default info)
          --max-transfers N        transfers running at once (default 16)
          --max-body-bytes N       largest API request body (default 16777216)
          --max-open-tasks N       unfinished tasks one session may hold (default 1000000; more: 429)
          --shutdown-grace SECONDS how long SIGTERM waits for running transfers (default 10)
          --ca-bundle FILE         CA certificates for https destinations
          --webhook-retry-schedule S  seconds before each delivery attempt, comma-separated
                                   (default 0,5,300,1800,7200,18000,36000,50400,72000,86400)
          --progress-interval SECONDS  task.progress events per running task at most this often (default 5)
          --route-file FILE        the routing table the network is detected from (default /proc/net/route)
          --token-file FILE        API bearer tokens, one "TOKEN admin" or "TOKEN client SESSION-PATTERN..." a line
          --allow-upload-host P    upload destinations allowed (host glob, optionally scheme://; repeatable; default any)
          --allow-webhook-host P   webhook receivers allowed (same form; repeatable; default any)
          --deny-private-destinations  refuse loopback, private and link-local destinations (checked on connect too)
          --no-ui                  do not serve the dashboard at / (the API alone)
          --version, --help
        environment: BACKHAUL_LISTEN, BACKHAUL_STATE_DIR, BACKHAUL_ALLOWED_ROOTS (colon-separated),
          BACKHAUL_CONFIG, BACKHAUL_LOG_LEVEL, BACKHAUL_MAX_TRANSFERS, BACKHAUL_MAX_BODY_BYTES,
          BACKHAUL_SHUTDOWN_GRACE, BACKHAUL_CA_BUNDLE, BACKHAUL_WEBHOOK_RETRY_SCHEDULE, BACKHAUL_PROGRESS_INTERVAL,
          BACKHAUL_ROUTE_FILE, BACKHAUL_TOKENS (token entries separated by ";"), BACKHAUL_DENY_PRIVATE_DESTINATIONS (1), BACKHAUL_UI (0: no dashboard)
        config file only: "network" (interface patterns, check_interval) and "policy" (see README)
        """

    public struct Invalid: Error, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// What the command line asked for besides running.
    public enum Action: Sendable, Equatable { case run, help, version }

    /// Resolves the configuration from arguments (without the program name), environment and file.
    public static func resolve(arguments: [String], environment: [String: String], workingDirectory: String) throws(Invalid)
        -> (DaemonConfiguration, Action)
    {
        var configuration = DaemonConfiguration(workingDirectory: workingDirectory)
        // Flags are read first into a list, so --config can be applied before everything else.
        var flags: [(String, String)] = []
        var index = 0
        while index < arguments.count {
            var name = arguments[index]
            var value: String?
            if name == "--help" || name == "-h" { return (configuration, .help) }
            if name == "--version" { return (configuration, .version) }
            if name == "--deny-private-destinations" || name == "--no-ui" {
                flags.append(name == "--no-ui" ? ("--ui", "false") : (name, "true"))
                index += 1
                continue
            }
            if let equals = name.firstIndex(of: "="), name.hasPrefix("--") {
                value = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            guard ["--listen", "--state-dir", "--allow-root", "--config", "--log-level", "--max-transfers",
                   "--max-body-bytes", "--shutdown-grace", "--ca-bundle", "--webhook-retry-schedule",
                   "--progress-interval", "--route-file", "--token-file", "--allow-upload-host", "--max-open-tasks",
                   "--allow-webhook-host"].contains(name)
            else { throw Invalid(description: "unknown option \(name)\n\(usage)") }
            if value == nil {
                index += 1
                guard index < arguments.count else { throw Invalid(description: "\(name) needs a value") }
                value = arguments[index]
            }
            flags.append((name, value!))
            index += 1
        }
        let configPath = flags.last(where: { $0.0 == "--config" })?.1 ?? environment["BACKHAUL_CONFIG"]
        if let configPath {
            configuration.configFile = configPath
            try configuration.applyFile(configPath)
        }
        if let value = environment["BACKHAUL_LISTEN"] { try configuration.set("listen", value) }
        if let value = environment["BACKHAUL_STATE_DIR"] { try configuration.set("state_dir", value) }
        if let value = environment["BACKHAUL_ALLOWED_ROOTS"] {
            configuration.allowedRoots = value.split(separator: ":").map(String.init)
        }
        if let value = environment["BACKHAUL_LOG_LEVEL"] { try configuration.set("log_level", value) }
        if let value = environment["BACKHAUL_MAX_TRANSFERS"] { try configuration.set("max_transfers", value) }
        if let value = environment["BACKHAUL_MAX_BODY_BYTES"] { try configuration.set("max_body_bytes", value) }
        if let value = environment["BACKHAUL_SHUTDOWN_GRACE"] { try configuration.set("shutdown_grace", value) }
        if let value = environment["BACKHAUL_CA_BUNDLE"] { try configuration.set("ca_bundle", value) }
        if let value = environment["BACKHAUL_WEBHOOK_RETRY_SCHEDULE"] { try configuration.set("webhook_retry_schedule", value) }
        if let value = environment["BACKHAUL_PROGRESS_INTERVAL"] { try configuration.set("progress_interval", value) }
        if let value = environment["BACKHAUL_ROUTE_FILE"] { try configuration.set("route_file", value) }
        if let value = environment["BACKHAUL_DENY_PRIVATE_DESTINATIONS"] { try configuration.set("deny_private_destinations", value) }
        if let value = environment["BACKHAUL_UI"] { try configuration.set("ui", value) }
        if let value = environment["BACKHAUL_TOKENS"] {
            do { configuration.tokens = try AccessTokens(parsing: value) } catch { throw Invalid(description: "BACKHAUL_TOKENS: \(error)") }
        }
        var roots: [String] = []
        for (name, value) in flags {
            switch name {
            case "--allow-root": roots.append(value)
            case "--allow-upload-host": configuration.destinations.uploadHosts.append(value)
            case "--allow-webhook-host": configuration.destinations.webhookHosts.append(value)
            case "--config": break
            default: try configuration.set(String(name.dropFirst(2)).replacingHyphens(), value)
            }
        }
        if !roots.isEmpty { configuration.allowedRoots = roots }
        guard !configuration.allowedRoots.isEmpty else { throw Invalid(description: "at least one allowed root is needed") }
        for root in configuration.allowedRoots where !root.hasPrefix("/") {
            throw Invalid(description: "allowed roots must be absolute paths: \(root)")
        }
        return (configuration, .run)
    }

    mutating func set(_ key: String, _ value: String) throws(Invalid) {
        switch key {
        case "listen":
            guard let (host, port) = Self.parseListen(value) else {
                throw Invalid(description: "listen must be HOST:PORT with a numeric IP (or localhost): \(value)")
            }
            listenHost = host
            listenPort = port
        case "state_dir": stateDirectory = value
        case "log_level":
            guard ["trace", "debug", "info", "notice", "warning", "error", "critical"].contains(value) else {
                throw Invalid(description: "unknown log level \(value)")
            }
            logLevel = value
        case "max_transfers":
            guard let number = Int(value), (1...1024).contains(number) else {
                throw Invalid(description: "max transfers must be 1 to 1024")
            }
            maxConcurrentTransfers = number
        case "max_body_bytes":
            guard let number = Int(value), number >= 1024 else { throw Invalid(description: "max body bytes must be at least 1024") }
            maxBodyBytes = number
        case "shutdown_grace":
            guard let number = Double(value), number >= 0, number <= 3600 else {
                throw Invalid(description: "shutdown grace must be 0 to 3600 seconds")
            }
            shutdownGraceSeconds = number
        case "ca_bundle": caBundle = value
        case "webhook_retry_schedule":
            let delays = value.split(separator: ",").map { Double($0.trimmed()) }
            guard !delays.isEmpty, delays.count <= 50, delays.allSatisfy({ ($0 ?? -1) >= 0 && ($0 ?? 0) <= 604_800 }) else {
                throw Invalid(description: "the webhook retry schedule is 1 to 50 comma-separated delays in seconds")
            }
            webhookRetrySchedule = delays.map { $0! }
        case "progress_interval":
            guard let number = Double(value), number >= 0.1, number <= 3600 else {
                throw Invalid(description: "progress interval must be 0.1 to 3600 seconds")
            }
            progressInterval = number
        case "route_file": routeFile = value
        case "max_open_tasks":
            guard let number = Int(value), number >= 1 else { throw Invalid(description: "max open tasks must be at least 1") }
            maxOpenTasksPerSession = number
        case "deny_private_destinations":
            guard ["true", "1", "false", "0"].contains(value) else { throw Invalid(description: "deny_private_destinations is true or false") }
            destinations.denyPrivate = value == "true" || value == "1"
        case "ui":
            guard ["true", "1", "false", "0"].contains(value) else { throw Invalid(description: "ui is true or false") }
            dashboard = value == "true" || value == "1"
        case "token_file":
            guard let text = SmallFile.read(value) else { throw Invalid(description: "cannot read the token file \(value)") }
            do { tokens = try AccessTokens(parsing: String(decoding: text, as: UTF8.self)) } catch {
                throw Invalid(description: "\(value): \(error)")
            }
            tokenFile = value
        default: throw Invalid(description: "unknown setting \(key)")
        }
    }

    /// The config file: a JSON object with the same names as the flags, in snake case
    /// (`listen`, `state_dir`, `allowed_roots` as an array, `log_level`, `max_transfers`,
    /// `max_body_bytes`, `shutdown_grace`, `ca_bundle`).
    mutating func applyFile(_ path: String) throws(Invalid) {
        guard let bytes = SmallFile.read(path) else { throw Invalid(description: "cannot read the config file \(path)") }
        let value: JSON
        do { value = try JSON.parse(bytes) } catch { throw Invalid(description: "the config file is not valid JSON: \(error)") }
        guard let object = value.objectValue else { throw Invalid(description: "the config file must hold a JSON object") }
        for (key, member) in object {
            switch (key, member) {
            case ("allowed_roots", .array(let items)):
                allowedRoots = items.compactMap(\.stringValue)
            case ("network", .object):
                do {
                    try classifier.apply(member)
                    if let file = member["route_file"]?.stringValue { routeFile = file }
                    if let interval = member["check_interval"]?.doubleValue {
                        guard interval >= 0.1, interval <= 3600 else { throw ValidationError("network.check_interval", "must be 0.1 to 3600 seconds") }
                        networkCheckInterval = interval
                    }
                } catch { throw Invalid(description: "config file: \(error)") }
            case ("policy", .object):
                do { policy = try policy.applying(member) } catch { throw Invalid(description: "config file: \(error)") }
            case ("upload_hosts", .array(let items)):
                destinations.uploadHosts = items.compactMap(\.stringValue)
            case ("webhook_hosts", .array(let items)):
                destinations.webhookHosts = items.compactMap(\.stringValue)
            case ("deny_private_destinations", .bool(let value)):
                destinations.denyPrivate = value
            case ("ui", .bool(let value)):
                dashboard = value
            case ("webhook_retry_schedule", .array(let items)):
                try set(key, items.compactMap(\.doubleValue).map { String($0) }.joined(separator: ","))
            case (_, .string(let text)): try set(key, text)
            case (_, .int(let number)): try set(key, String(number))
            case (_, .double(let number)): try set(key, String(number))
            default: throw Invalid(description: "config file: \(key) has an unexpected value")
            }
        }
    }

    static func parseListen(_ value: String) -> (String, UInt16)? {
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
        guard let port = UInt16(portText) else { return nil }
        if host == "localhost" { host = "127.0.0.1" }
        return (String(host), port)
    }

    /// Without tokens the daemon serves loopback only (SPEC §2.6).
    public var isLoopback: Bool { listenHost.hasPrefix("127.") || listenHost == "::1" }

    /// What `/v1/info` shows: everything here holds no secret.
    public var infoJSON: JSONObject {
        [
            "listen": .string(listen), "state_dir": .string(stateDirectory),
            "allowed_roots": .array(allowedRoots.map { .string($0) }), "log_level": .string(logLevel),
            "max_transfers": .int(Int64(maxConcurrentTransfers)), "max_open_tasks": .int(Int64(maxOpenTasksPerSession)), "max_body_bytes": .int(Int64(maxBodyBytes)),
            "shutdown_grace": .double(shutdownGraceSeconds), "ca_bundle": caBundle.map { .string($0) } ?? .null,
            "webhook_retry_schedule": .array(webhookRetrySchedule.map { .double($0) }), "progress_interval": .double(progressInterval),
            "route_file": .string(routeFile), "network_check_interval": .double(networkCheckInterval),
            "authentication": .string(tokens == nil ? "off (loopback only)" : "bearer tokens"),
            "upload_hosts": .array(destinations.uploadHosts.map { .string($0) }),
            "webhook_hosts": .array(destinations.webhookHosts.map { .string($0) }),
            "deny_private_destinations": .bool(destinations.denyPrivate),
            "ui": .bool(dashboard),
        ]
    }
}

extension StringProtocol {
    fileprivate func replacingHyphens() -> String { String(map { $0 == "-" ? "_" : $0 }) }
}
