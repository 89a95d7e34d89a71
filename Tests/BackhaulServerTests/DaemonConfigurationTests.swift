import BackhaulAPI
import BackhaulCore
import Foundation
import JSONCodec
import Testing

@testable import BackhaulServer

/// A scratch directory for config and token files, removed when the test process exits.
final class Scratch: Sendable {
    static let path = NSTemporaryDirectory() + "backhaul-config-\(getpid())"
    var path: String { Self.path }

    init() {
        try? FileManager.default.createDirectory(atPath: Self.path, withIntermediateDirectories: true)
        atexit { try? FileManager.default.removeItem(atPath: Scratch.path) }
    }

    func write(_ name: String, _ text: String) -> String {
        let file = path + "/" + name
        _ = FileManager.default.createFile(atPath: file, contents: Data(text.utf8))
        return file
    }

    /// A config file holding `member` under the setting's file key (a dotted key nests).
    func configFile(_ key: String, _ member: JSON) -> String {
        let parts = key.split(separator: ".").map(String.init)
        let value = parts.reversed().reduce(member) { inner, part in JSON.object([part: inner]) }
        return write("config-\(UUID().uuidString).json", value.serialized())
    }
}

func resolved(_ arguments: [String] = [], environment: [String: String] = [:]) throws -> DaemonConfiguration {
    let (configuration, action) = try DaemonConfiguration.resolve(
        arguments: arguments, environment: environment, workingDirectory: "/work")
    #expect(action == .run)
    return configuration
}

/// A value for each source a setting has, and how to read the setting back through the public
/// properties (so a table entry wired to the wrong property shows).
struct Sample: Sendable, CustomTestStringConvertible {
    var setting: String
    var file: JSON?
    var environment: String?
    var flags: [String]?
    var read: @Sendable (DaemonConfiguration) -> JSON
    /// After the defaults, the file, the environment, the flags (for the sources it has).
    var expected: [JSON]
    var testDescription: String { setting }
}

@Suite("backhauld configuration: one table of settings")
struct DaemonConfigurationTests {
    static let scratch = Scratch()
    static let tokenFiles = [
        scratch.write("tokens-a", "aaaaaaaaaaaaaaaa admin\n"), scratch.write("tokens-c", "cccccccccccccccc client cam-*\n"),
    ]

    static func whichToken(_ configuration: DaemonConfiguration) -> JSON {
        guard let tokens = configuration.tokens else { return .null }
        for letter in ["a", "b", "c"]
        where tokens.principal(authorization: "Bearer " + String(repeating: letter, count: 16)) != nil {
            return .string(letter)
        }
        return "?"
    }

    static let samples: [Sample] = [
        Sample(
            setting: "listen", file: "127.0.0.1:9001", environment: "[::1]:9002", flags: ["localhost:0"],
            read: { .string($0.listen) },
            expected: ["127.0.0.1:8427", "127.0.0.1:9001", "[::1]:9002", "127.0.0.1:0"]),
        Sample(
            setting: "state_dir", file: "/s1", environment: "/s2", flags: ["/s3"], read: { .string($0.stateDirectory) },
            expected: ["./backhaul-state", "/s1", "/s2", "/s3"]),
        Sample(
            setting: "state_url", file: "postgres://a@h1/db", environment: "postgresql://b@h2/db", flags: ["postgres://c@h3/db"],
            read: { $0.stateURL.map { .string($0) } ?? .null },
            expected: [.null, "postgres://a@h1/db", "postgresql://b@h2/db", "postgres://c@h3/db"]),
        Sample(
            setting: "node_id", file: "n1", environment: "n2", flags: ["n3"], read: { $0.nodeID.map { .string($0) } ?? .null },
            expected: [.null, "n1", "n2", "n3"]),
        Sample(
            setting: "lease_seconds", file: 5, environment: "6", flags: ["7.5"], read: { .double($0.leaseSeconds) },
            expected: [30, 5, 6, 7.5]),
        Sample(
            setting: "shared_roots", file: ["/n1"], environment: "/n2:/n2b", flags: ["/n3", "/n3b"],
            read: { .array($0.sharedRoots.map { .string($0) }) },
            expected: [[], ["/n1"], ["/n2", "/n2b"], ["/n3", "/n3b"]]),
        Sample(
            setting: "allowed_roots", file: ["/r1"], environment: "/r2:/r2b", flags: ["/r3", "/r3b"],
            read: { .array($0.allowedRoots.map { .string($0) }) },
            expected: [["/work"], ["/r1"], ["/r2", "/r2b"], ["/r3", "/r3b"]]),
        Sample(
            setting: "log_level", file: "debug", environment: "notice", flags: ["error"], read: { .string($0.logLevel) },
            expected: ["info", "debug", "notice", "error"]),
        Sample(
            setting: "max_transfers", file: 2, environment: "3", flags: ["4"], read: { .int(Int64($0.maxConcurrentTransfers)) },
            expected: [16, 2, 3, 4]),
        Sample(
            setting: "max_body_bytes", file: 2048, environment: "4096", flags: ["8192"], read: { .int(Int64($0.maxBodyBytes)) },
            expected: [16_777_216, 2048, 4096, 8192]),
        Sample(
            setting: "shutdown_grace", file: 1.5, environment: "2", flags: ["0"], read: { .double($0.shutdownGraceSeconds) },
            expected: [10, 1.5, 2, 0]),
        Sample(
            setting: "ca_bundle", file: "/c1", environment: "/c2", flags: ["/c3"],
            read: { $0.caBundle.map { .string($0) } ?? .null },
            expected: [.null, "/c1", "/c2", "/c3"]),
        Sample(
            setting: "webhook_retry_schedule", file: [1, 2], environment: "3, 4", flags: ["5"],
            read: { .array($0.webhookRetrySchedule.map { .double($0) }) },
            expected: [.array(DeliveryPlan.standardSchedule.map { .double($0) }), [1, 2], [3, 4], [5]]),
        Sample(
            setting: "progress_interval", file: 1, environment: "0.5", flags: ["60"], read: { .double($0.progressInterval) },
            expected: [5, 1, 0.5, 60]),
        Sample(
            setting: "write_pacing", file: 0, environment: "0.01", flags: ["0.5"], read: { .double($0.writePacing) },
            expected: [0.002, 0, 0.01, 0.5]),
        Sample(
            setting: "route_file", file: "/f1", environment: "/f2", flags: ["/f3"], read: { .string($0.routeFile) },
            expected: ["/proc/net/route", "/f1", "/f2", "/f3"]),
        Sample(
            setting: "token_file", file: .string(tokenFiles[0]),
            environment: "bbbbbbbbbbbbbbbb admin; x0x0x0x0x0x0x0x0x0 client cam-1",
            flags: [tokenFiles[1]], read: whichToken, expected: [.null, "a", "b", "c"]),
        Sample(
            setting: "upload_hosts", file: ["a.example"], flags: ["c.example", "https://d.example"],
            read: { .array($0.destinations.uploadHosts.map { .string($0) }) },
            expected: [[], ["a.example"], ["c.example", "https://d.example"]]),
        Sample(
            setting: "webhook_hosts", file: ["a.example"], flags: ["c.example"],
            read: { .array($0.destinations.webhookHosts.map { .string($0) }) }, expected: [[], ["a.example"], ["c.example"]]),
        Sample(
            setting: "deny_private_destinations", file: true, environment: "0", flags: ["true"],
            read: { .bool($0.destinations.denyPrivate) },
            expected: [false, true, false, true]),
        Sample(
            setting: "aws_imds", file: true, environment: "0", flags: ["true"], read: { .bool($0.awsIMDS) },
            expected: [false, true, false, true]),
        Sample(
            setting: "max_open_tasks", file: 5, flags: ["7"], read: { .int(Int64($0.maxOpenTasksPerSession)) },
            expected: [1_000_000, 5, 7]),
        Sample(
            setting: "finished_task_retention", file: 60, environment: "3600.5", flags: ["86400"],
            read: { .double($0.finishedTaskRetention) },
            expected: [604_800, 60, 3600.5, 86400]),
        Sample(
            setting: "network_source", file: "networkmanager", environment: "routing-table", flags: ["auto"],
            read: { .string($0.networkSource.rawValue) }, expected: ["auto", "networkmanager", "routing-table", "auto"]),
        Sample(
            setting: "on_corrupt_state", file: "refuse", environment: "salvage", flags: ["refuse"],
            read: { .string($0.onCorruptState.rawValue) }, expected: ["salvage", "refuse", "salvage", "refuse"]),
        Sample(
            setting: "wal_cap_frames", file: 500, flags: ["2000"], read: { .int(Int64($0.walCapFrames)) },
            expected: [16384, 500, 2000]),
        Sample(
            setting: "ui", file: false, environment: "1", flags: ["true"], read: { .bool($0.dashboard) },
            expected: [true, false, true, false]),
        Sample(
            setting: "network", file: ["check_interval": 2, "cellular_interfaces": ["lte*"]],
            read: {
                ["interval": .double($0.networkCheckInterval), "cellular": .array($0.classifier.cellular.map { .string($0) })]
            },
            expected: [
                ["interval": 1, "cellular": ["wwan*", "ppp*", "rmnet*", "usb*"]], ["interval": 2, "cellular": ["lte*"]],
            ]),
        Sample(
            setting: "policy", file: ["transfers_enabled": false, "bandwidth_limit": 2048],
            read: {
                ["enabled": .bool($0.policy.transfersEnabled), "limit": $0.policy.bandwidthLimit.map { .int($0) } ?? .null]
            },
            expected: [["enabled": true, "limit": .null], ["enabled": false, "limit": 2048]]),
    ]

    @Test("every setting of the table has a sample for each of its sources (config is tested on its own)")
    func samplesCoverTheTable() throws {
        let settings = DaemonConfiguration.Settings.all
        #expect(Set(Self.samples.map(\.setting)) == Set(settings.map(\.name)).subtracting(["config"]))
        for sample in Self.samples {
            let setting = try #require(settings.first { $0.name == sample.setting })
            #expect((sample.file != nil) == (setting.file != nil), "\(sample.setting): file")
            #expect((sample.environment != nil) == (setting.environment != nil), "\(sample.setting): environment")
            #expect((sample.flags != nil) == (setting.flag != nil), "\(sample.setting): flag")
            #expect(
                sample.flags.map { $0.count == 1 || setting.flag?.repeatable == true } ?? true, "\(sample.setting): repeated flag"
            )
        }
    }

    @Test("each setting by its file key, variable and flag: defaults < file < environment < flags", arguments: samples)
    func precedence(_ sample: Sample) throws {
        let setting = try #require(DaemonConfiguration.Settings.all.first { $0.name == sample.setting })
        var expected = sample.expected.makeIterator()
        var arguments: [String] = []
        var environment: [String: String] = [:]
        #expect(sample.read(try resolved()) == expected.next(), "default")
        if let member = sample.file, let key = setting.file?.key {
            arguments = ["--config", Self.scratch.configFile(key, member)]
            #expect(sample.read(try resolved(arguments)) == expected.next(), "config file")
        }
        if let text = sample.environment, let variable = setting.environment?.name {
            environment[variable] = text
            #expect(sample.read(try resolved(arguments, environment: environment)) == expected.next(), "environment")
        }
        if let values = sample.flags, let flag = setting.flag {
            let given = values.flatMap { flag.placeholder == nil ? [flag.name] : [flag.name, $0] }
            #expect(sample.read(try resolved(arguments + given, environment: environment)) == expected.next(), "flags")
            // `--name=value` is the same flag.
            let joined = values.map { "\(flag.name)=\($0)" }
            #expect(
                sample.read(try resolved(arguments + joined, environment: environment)) == sample.expected.last, "--name=value")
        }
        #expect(expected.next() == nil, "every expected value was reached")
    }

    @Test("--config beats BACKHAUL_CONFIG; the file is read before the environment and the flags")
    func configFile() throws {
        let first = Self.scratch.write("first.json", #"{"max_transfers": 2, "log_level": "debug"}"#)
        let second = Self.scratch.write("second.json", #"{"max_transfers": 3}"#)
        let fromEnvironment = try resolved(environment: ["BACKHAUL_CONFIG": first])
        #expect(
            fromEnvironment.configFile == first && fromEnvironment.maxConcurrentTransfers == 2
                && fromEnvironment.logLevel == "debug")
        let fromFlag = try resolved(["--max-transfers", "9", "--config", second], environment: ["BACKHAUL_CONFIG": first])
        #expect(fromFlag.configFile == second && fromFlag.maxConcurrentTransfers == 9 && fromFlag.logLevel == "info")
        // The undocumented top-level `route_file` is still read.
        #expect(try resolved(["--config", Self.scratch.write("route.json", #"{"route_file": "/r"}"#)]).routeFile == "/r")
    }

    @Test("--help, -h and --version stop reading the flags")
    func actions() throws {
        for (arguments, action) in [
            (["--help"], DaemonConfiguration.Action.help), (["--max-transfers", "0", "-h"], .help),
            (["--version", "--bogus"], .version),
        ] {
            #expect(try DaemonConfiguration.resolve(arguments: arguments, environment: [:], workingDirectory: "/").1 == action)
        }
    }

    @Test("the usage text lists every flag with its help, variable, file key and default")
    func usage() {
        let usage = DaemonConfiguration.usage
        for setting in DaemonConfiguration.Settings.all {
            #expect(usage.contains(setting.help), "\(setting.name)")
            if let flag = setting.flag { #expect(usage.contains("  \(flag.name)"), "\(flag.name)") }
            if let variable = setting.environment { #expect(usage.contains(variable.name), "\(variable.name)") }
            if let file = setting.file { #expect(usage.contains("\"\(file.key)\""), "\(file.key)") }
            #expect(usage.contains(setting.flag == nil ? "\"\(setting.name)\"" : "default \(setting.defaultDescription.text)"))
        }
        #expect(usage.contains("--finished-task-retention SECONDS") && usage.contains("default 604800"))
    }

    /// A refused value and what the message must say.
    struct Refusal: Sendable, CustomTestStringConvertible {
        var arguments: [String] = []
        var environment: [String: String] = [:]
        var file: String?
        var message: String
        var testDescription: String { message }
    }

    static let refusals: [Refusal] = [
        Refusal(arguments: ["--max-transfers", "0"], message: "--max-transfers 0: must be a whole number from 1 to 1024"),
        Refusal(arguments: ["--max-transfers=many"], message: "--max-transfers many: must be a whole number from 1 to 1024"),
        Refusal(
            arguments: ["--max-body-bytes", "1000"], message: "--max-body-bytes 1000: must be a whole number, at least 1024"),
        Refusal(arguments: ["--max-open-tasks", "0"], message: "--max-open-tasks 0: must be a whole number, at least 1"),
        Refusal(
            arguments: ["--shutdown-grace", "3601"],
            message: "--shutdown-grace 3601: must be a number of seconds, at least 0 and at most 3600"),
        Refusal(
            arguments: ["--progress-interval", "0.05"], message: "must be a number of seconds, at least 0.1 and at most 3600"),
        Refusal(
            arguments: ["--finished-task-retention", "0"],
            message: "--finished-task-retention 0: must be a positive number of seconds"),
        Refusal(
            arguments: ["--finished-task-retention", "-60"],
            message: "--finished-task-retention -60: must be a positive number of seconds"),
        Refusal(arguments: ["--finished-task-retention", "a week"], message: "must be a positive number of seconds"),
        Refusal(arguments: ["--finished-task-retention", "inf"], message: "must be a positive number of seconds"),
        Refusal(arguments: ["--finished-task-retention", "nan"], message: "must be a positive number of seconds"),
        Refusal(
            environment: ["BACKHAUL_FINISHED_TASK_RETENTION": "0"],
            message: "BACKHAUL_FINISHED_TASK_RETENTION=0: must be a positive"),
        Refusal(
            file: #"{"finished_task_retention": -1}"#, message: "finished_task_retention: must be a positive number of seconds"),
        Refusal(
            file: #"{"finished_task_retention": [1]}"#,
            message: "finished_task_retention: is array, not a string, number or boolean"),
        Refusal(arguments: ["--listen", "8427"], message: "--listen 8427: must be HOST:PORT with a numeric IP (or localhost)"),
        Refusal(arguments: ["--listen", ":8427"], message: "must be HOST:PORT"),
        Refusal(arguments: ["--log-level", "loud"], message: "--log-level loud: must be one of trace, debug, info"),
        Refusal(
            environment: ["BACKHAUL_ON_CORRUPT_STATE": "repair"],
            message: "BACKHAUL_ON_CORRUPT_STATE=repair: must be one of salvage, refuse, not repair"),
        Refusal(
            arguments: ["--webhook-retry-schedule", "1,-2"],
            message: "must be 1 to 50 comma-separated delays of 0 to 604800 seconds"),
        Refusal(
            environment: ["BACKHAUL_WEBHOOK_RETRY_SCHEDULE": Array(repeating: "1", count: 51).joined(separator: ",")],
            message: "BACKHAUL_WEBHOOK_RETRY_SCHEDULE="),
        Refusal(file: #"{"webhook_retry_schedule": [1, "x"]}"#, message: "webhook_retry_schedule: must be 1 to 50"),
        Refusal(
            arguments: ["--allow-root", "/ok", "--allow-root", "relative"],
            message: "--allow-root: allowed roots must be absolute paths: relative"),
        Refusal(
            environment: ["BACKHAUL_ALLOWED_ROOTS": ""], message: "BACKHAUL_ALLOWED_ROOTS=: at least one allowed root is needed"),
        Refusal(file: #"{"allowed_roots": []}"#, message: "allowed_roots: at least one allowed root is needed"),
        Refusal(file: #"{"allowed_roots": "/x"}"#, message: "allowed_roots: must be an array of strings"),
        Refusal(arguments: ["--deny-private-destinations=maybe"], message: "must be true, 1, false or 0, not maybe"),
        Refusal(environment: ["BACKHAUL_DENY_PRIVATE_DESTINATIONS": "yes"], message: "BACKHAUL_DENY_PRIVATE_DESTINATIONS=yes"),
        Refusal(arguments: ["--token-file", "/nonexistent/tokens"], message: "cannot read the token file /nonexistent/tokens"),
        Refusal(
            environment: ["BACKHAUL_TOKENS": "secret-token-of-a-client client"],
            message: "BACKHAUL_TOKENS: token entry 1: a client token needs session patterns"),
        Refusal(arguments: ["--bogus"], message: "unknown option --bogus\nusage: backhauld"),
        Refusal(arguments: ["--state-dir"], message: "--state-dir needs a value (DIR)"),
        Refusal(arguments: ["--state-dir="], message: "--state-dir : must not be empty"),
        Refusal(file: #"{"colour": 1}"#, message: "unknown setting colour"),
        Refusal(file: #"{"max_transfers": 16.5}"#, message: "max_transfers: must be a whole number from 1 to 1024"),
        Refusal(file: #"{"network": {"check_interval": 0}}"#, message: ": network.check_interval: must be 0.1 to 3600 seconds"),
        Refusal(file: #"{"network": {"speed": 1}}"#, message: "network.speed"),
        Refusal(file: #"{"policy": {"bandwidth_limit": -1}}"#, message: "policy.bandwidth_limit"),
        Refusal(file: #"{"network": {"route_file": ""}}"#, message: "network.route_file: must not be empty"),
        Refusal(file: "[1]", message: "must hold a JSON object"),
        Refusal(file: "{", message: "not valid JSON"),
    ]

    @Test("invalid values are refused, saying where they came from and what is wanted", arguments: refusals)
    func refused(_ refusal: Refusal) {
        var arguments = refusal.arguments
        if let text = refusal.file { arguments += ["--config", Self.scratch.write("refused-\(UUID().uuidString).json", text)] }
        do {
            _ = try DaemonConfiguration.resolve(arguments: arguments, environment: refusal.environment, workingDirectory: "/work")
            Issue.record("accepted")
        } catch {
            #expect(error.description.contains(refusal.message), "\(error.description)")
            #expect(!error.description.contains("secret-token"), "a token is never repeated")
        }
    }

    @Test("/v1/info shows each setting as the table says: the new retention, never a token")
    func info() throws {
        let info = try resolved(environment: [
            "BACKHAUL_TOKENS": "bbbbbbbbbbbbbbbb admin", "BACKHAUL_STATE_URL": "postgres://backhaul:s3cret-pw@db:5432/backhaul",
        ]).infoJSON
        // The state's URL holds the database's password: only which store is in use shows.
        #expect(info["state"] == .string("postgresql"))
        #expect(!JSON.object(info).serialized().contains("s3cret-pw"))
        #expect(
            info.keys == [
                "listen", "state_dir", "state", "node_id", "lease_seconds", "shared_roots", "allowed_roots", "log_level",
                "max_transfers", "max_body_bytes", "shutdown_grace",
                "ca_bundle",
                "webhook_retry_schedule", "progress_interval", "write_pacing", "route_file", "network_source", "authentication",
                "upload_hosts",
                "webhook_hosts",
                "deny_private_destinations", "aws_imds", "max_open_tasks", "finished_task_retention", "on_corrupt_state",
                "wal_cap_frames",
                "ui",
                "network_check_interval",
            ])
        #expect(info["finished_task_retention"] == .double(604_800) && info["max_transfers"] == .int(16))
        #expect(info["authentication"] == "bearer tokens" && info["ca_bundle"] == .null && info["listen"] == "127.0.0.1:8427")
        #expect(!JSON.object(info).serialized().contains("bbbbbbbbbbbbbbbb"))
        #expect(try resolved().infoJSON["authentication"] == "off (loopback only)")
        #expect(try resolved(["--finished-task-retention", "90"]).infoJSON["finished_task_retention"] == .double(90))
    }

    /// docs/operations.md's Configuration table is generated from the settings table, and this
    /// test keeps them one: it fails when they differ, and with `BACKHAUL_UPDATE_DOCS=1` it
    /// rewrites the page's table instead.
    @Test("docs/operations.md's Configuration table is the one the settings table generates")
    func documentedTable() throws {
        let readme = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
            .appendingPathComponent("docs/operations.md")
        let text = try String(contentsOf: readme, encoding: .utf8)
        let section = try #require(text.range(of: "\n## Configuration\n"))
        let start = try #require(text.range(of: "\n| flag |", range: section.upperBound..<text.endIndex))
        let end = text.range(of: "\n\n", range: start.upperBound..<text.endIndex)?.lowerBound ?? text.endIndex
        let table = String(text[text.index(after: start.lowerBound)..<end])
        let generated = DaemonConfiguration.markdownTable
        if ProcessInfo.processInfo.environment["BACKHAUL_UPDATE_DOCS"] == "1", table != generated {
            try text.replacingCharacters(in: text.index(after: start.lowerBound)..<end, with: generated)
                .write(to: readme, atomically: true, encoding: .utf8)
            return
        }
        #expect(table == generated, "docs/operations.md's table should read (BACKHAUL_UPDATE_DOCS=1 writes it):\n\(generated)")
    }
}
