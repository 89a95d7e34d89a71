import BackhaulCore
import BackhaulTesting
import Curl
import Foundation
import Glibc
import JSONCodec
import Testing

/// The state fixture written by the v1 release (`Tests/fixtures/state-v1`, its README says what
/// it holds and how it was made): where it lives, and what v1 answered about it.
struct StateFixtureV1 {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("fixtures").path
    static let directory = fixtures + "/state-v1"

    let manifest: JSON

    init() throws {
        let data = try #require(FileManager.default.contents(atPath: Self.directory + "/expected.json"))
        manifest = try JSON.parse(Array(data), maxDepth: 64)
    }

    var api: JSON { manifest["api"] ?? .null }
    var filesRoot: String { manifest["files_root"]?.stringValue ?? "" }
    func port(_ name: String) -> UInt16 { UInt16(manifest["ports"]?[name]?.intValue ?? 0) }
    func id(_ role: String) -> String { manifest["roles"]?[role]?.stringValue ?? "" }
    func webhook(_ name: String) -> String { manifest["webhooks"]?[name]?.stringValue ?? "" }
    /// The bytes of a file the fixture holds (`files/…`), read from the repository, not the copy.
    func file(_ relative: String) -> Data {
        FileManager.default.contents(atPath: Self.directory + "/files/" + relative) ?? Data()
    }

    /// Puts the fixture where a daemon and its peers expect it: the database in `state` with its
    /// times moved to now (`rebase-state-v1.py`), the tasks' files under the fixed root with their
    /// recorded modification times, the peers' stored state in `peers`. Returns the shift (s) and
    /// the local day the budget use was moved to.
    func install(state: String, peers: String) throws -> (shift: Int64, day: String) {
        let files = FileManager.default
        try? files.removeItem(atPath: filesRoot)
        try files.createDirectory(atPath: (filesRoot as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try files.copyItem(atPath: Self.directory + "/files", toPath: filesRoot)
        for (relative, info) in manifest["files"]?.objectValue ?? [:] {
            let nanoseconds = info["mtime_ns"]?.intValue ?? 0
            var times = [timespec(tv_sec: Int(nanoseconds / 1_000_000_000), tv_nsec: Int(nanoseconds % 1_000_000_000))]
            times.append(times[0])
            try #require(utimensat(AT_FDCWD, filesRoot + "/" + relative, times, 0) == 0, "utimensat \(relative)")
        }
        try files.createDirectory(atPath: state, withIntermediateDirectories: true)
        try files.copyItem(atPath: Self.directory + "/backhaul.db", toPath: state + "/backhaul.db")
        try files.copyItem(atPath: Self.directory + "/peers", toPath: peers)

        let shift = Int64(Date().timeIntervalSince1970.rounded(.down)) - (manifest["anchor"]?.intValue ?? 0)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [
            "python3", Self.fixtures + "/rebase-state-v1.py", state + "/backhaul.db", "--shift", String(shift),
            "--budget-day", manifest["budget_day"]?.stringValue ?? "", "--tus-files", peers + "/tus-files",
        ]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let answer = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        try #require(process.terminationStatus == 0, "rebase-state-v1.py failed")
        return (shift, (try? JSON.parse(Array(answer)))?["budget_day"]?.stringValue ?? "")
    }
}

/// An exclusive `flock` on the fixture's lock file, held while the fixed path and ports are in
/// use: two test runs on one machine (or a run and the generator) take turns. Released with the value.
final class FixtureLock {
    private let descriptor: Int32

    init(_ path: String, timeout: Double) throws {
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o666)
        try #require(descriptor >= 0, "cannot open \(path)")
        let locked = eventually(timeout: timeout, interval: 0.5) { flock(descriptor, LOCK_EX | LOCK_NB) == 0 }
        if !locked { close(descriptor) }
        try #require(locked, "\(path) stayed locked for \(Int(timeout)) s (another run uses the fixture's path and ports)")
        self.descriptor = descriptor
    }

    deinit {
        flock(descriptor, LOCK_UN)
        close(descriptor)
    }
}

/// Compares answers of the build under test with v1's, field by field, and keeps every difference
/// with its path. Times v1 stored are expected moved by the shift; fields a later build adds are
/// fine; a field it drops or changes is a difference.
struct AnswerComparison {
    /// The keys whose values are times the database stores (moved by the shift).
    static let storedTimes: Set<String> = [
        "created_at", "started_at", "finished_at", "next_attempt_at", "earliest_begin_at", "previous_secret_expires_at",
    ]

    let shift: Int64
    private(set) var differences: [String] = []

    init(shift: Int64) { self.shift = shift }

    /// `ignoring` names members of the top object left out (what may legitimately have moved on).
    /// `shifted` false: times are compared as written (JSON v1 kept inside a row, such as an
    /// event's data, is not moved).
    mutating func compare(_ actual: JSON?, _ expected: JSON?, _ path: String, ignoring: Set<String> = [], shifted: Bool = true) {
        guard let expected else { return differences.append("\(path): v1 recorded nothing") }
        guard let actual else { return differences.append("\(path): missing (v1: \(expected.serialized()))") }
        switch expected {
        case .object(let members):
            guard let object = actual.objectValue else { return mismatch(actual, expected, path) }
            for (key, value) in members where !ignoring.contains(key) {
                if shifted, Self.storedTimes.contains(key), let time = value.stringValue {
                    compareTime(object[key], time, path + "." + key)
                } else {
                    compare(object[key], value, path + "." + key, shifted: shifted)
                }
            }
        case .array(let items):
            guard let array = actual.arrayValue, array.count == items.count else { return mismatch(actual, expected, path) }
            for (index, item) in items.enumerated() { compare(array[index], item, "\(path)[\(index)]", shifted: shifted) }
        default:
            if actual != expected { mismatch(actual, expected, path) }
        }
    }

    /// A time v1 wrote, expected `shift` seconds later (to the millisecond the API shows).
    mutating func compareTime(_ actual: JSON?, _ expected: String, _ path: String) {
        guard let shown = actual?.stringValue, let value = Self.milliseconds(shown), let original = Self.milliseconds(expected)
        else { return differences.append("\(path): \(actual?.serialized() ?? "missing"), v1 \(expected) (+\(shift) s)") }
        if abs(value - (original + shift * 1000)) > 1 {
            differences.append("\(path): \(shown), v1 \(expected) + \(shift) s")
        }
    }

    mutating func expect(_ condition: Bool, _ message: @autoclosure () -> String) {
        if !condition { differences.append(message()) }
    }

    private mutating func mismatch(_ actual: JSON, _ expected: JSON, _ path: String) {
        differences.append("\(path): \(actual.serialized().prefix(400)), v1 \(expected.serialized().prefix(400))")
    }

    /// `2026-11-23T08:05:16.256Z` → milliseconds since the epoch, exactly.
    static func milliseconds(_ text: String) -> Int64? {
        guard text.hasSuffix("Z"), let dot = text.lastIndex(of: "."), let seconds = RFC3339.parse(String(text[..<dot]) + "Z"),
            let fraction = Int64(text[text.index(after: dot)..<text.index(before: text.endIndex)])
        else { return nil }
        return Int64(seconds) * 1000 + fraction
    }
}

extension EndToEndTests {
    @Test(
        "the state fixture written by v1 opens intact: every session, task, webhook, override comes through; its unfinished tasks run"
    )
    func stateFixtureV1() throws {
        let fixture = try StateFixtureV1()
        let lock = try FixtureLock(fixture.manifest["lock"]?.stringValue ?? "/tmp/backhaul-fixture-v1.lock", timeout: 300)
        defer {
            withExtendedLifetime(lock) {
                try? FileManager.default.removeItem(atPath: fixture.manifest["root"]?.stringValue ?? "")
            }
        }
        for name in ["sink", "tus", "download", "hooks"] {
            try #require(try !connectable(port: fixture.port(name)), "port \(fixture.port(name)) (\(name)) is in use")
        }
        let scratch = TemporaryDirectory("backhaul-state-v1")
        let peers = scratch.file("peers")
        let (shift, budgetDay) = try fixture.install(state: scratch.file("state"), peers: peers)

        // The peers on their fixed ports, with the state the unfinished tasks resume from.
        let sink = try RecordingSink(directory: peers + "/sink", fallback: .resumable, port: fixture.port("sink"))
        let tus = try TusServer(directory: peers, checksum: true, port: fixture.port("tus"))
        let downloads = try DownloadServer(directory: peers, port: fixture.port("download"))
        let secrets = fixture.manifest["webhook_secrets"]?["W1"]
        let receiver = try WebhookReceiver(
            directory: peers,
            secrets: [
                secrets?["current"]?.stringValue ?? "",
                secrets?["previous"]?.stringValue ?? "",
            ],
            port: fixture.port("hooks"))
        // Off their ports before the lock goes (defers run in reverse: the daemon first).
        defer {
            sink.stop()
            tus.peer.stop()
            downloads.peer.stop()
            receiver.stop()
        }
        let daemon = try DaemonProcess(stateDirectory: scratch.file("state"), allowedRoot: fixture.filesRoot)
        defer { if daemon.isRunning { _ = daemon.terminate() } }

        // 1. Everything v1 answered, answered again.
        var comparison = AnswerComparison(shift: shift)
        try compareWithV1(fixture, daemon, &comparison, firstLook: true)
        try compareEventLog(fixture, daemon, &comparison)
        compareBudget(fixture, daemon, day: budgetDay, &comparison)
        #expect(
            comparison.differences.isEmpty,
            Comment(
                rawValue: "differences from v1:\n" + comparison.differences.joined(separator: "\n")
                    + "\n--- daemon log ---\n" + daemon.log()))

        // 2. The unfinished tasks run: the runnable ones by themselves, the held ones released.
        let started = Date()
        let (id, call) = (fixture.id, daemon.call)
        let commands: [(String, String, JSON?)] = [
            ("POST", "/v1/tasks/\(id("P5"))/suspend", nil), ("POST", "/v1/tasks/\(id("P5"))/resume", nil),
            ("POST", "/v1/tasks/\(id("P6"))/resume", nil), ("POST", "/v1/tasks/\(id("R1"))/resume", nil),
            ("POST", "/v1/tasks/\(id("C2"))/resume", nil),
            ("PATCH", "/v1/sessions/paused", ["enabled": true]),
            ("PATCH", "/v1/tasks/\(id("F2"))", ["request": ["headers": ["Authorization": "Bearer renewed-token"]]]),
            ("PATCH", "/v1/tasks/\(id("P8"))", ["configuration": ["allows_constrained_network_access": nil]]),
            ("PATCH", "/v1/tasks/\(id("P9"))", ["configuration": ["discretionary": nil]]),
        ]
        for (method, path, body) in commands {
            let (status, answer) = try call(method, path, body, [], 30)
            #expect(status == 200, "\(method) \(path): \(status) \(answer.serialized())")
        }
        let runnable = ["P5", "P6", "P8", "P9", "P10", "F2", "Q2", "R1", "R2"]
        var outcome: [String: String] = [:]
        let finished = try eventually(timeout: 90, interval: 0.2) {
            for role in runnable where outcome[role] == nil {
                let state = try daemon.task(id(role))["state"]?.stringValue ?? "missing"
                if ["completed", "failed", "cancelled"].contains(state) { outcome[role] = state }
            }
            // C2 ends its session; its final record stays readable (OpenAPI/backhaul.yaml).
            if outcome["C2"] == nil {
                let (_, task) = try call("GET", "/v1/tasks/\(id("C2"))", nil, [], 30)
                if let state = task["state"]?.stringValue, ["completed", "failed", "cancelled"].contains(state) {
                    outcome["C2"] = state
                }
            }
            return outcome.count == runnable.count + 1
        }
        daemonExpect(daemon, finished && outcome.values.allSatisfy { $0 == "completed" }, "outcomes: \(outcome)")
        print(
            "state fixture v1: times moved \(shift) s; \(outcome.count) unfinished tasks ran in "
                + String(format: "%.1f s", Date().timeIntervalSince(started)))

        // 3. Each arrived byte-exact, with the headers v1 stored (secrets included).
        checkUploads(fixture, sink)
        checkResumedProtocols(fixture, sink: sink, tus: tus, downloads: downloads)
        checkWebhooks(fixture, daemon, receiver)

        // 4. The rest is as v1 left it: the finished tasks, the scheduled one still waiting.
        var after = AnswerComparison(shift: shift)
        try compareWithV1(fixture, daemon, &after, firstLook: false)
        #expect(after.differences.isEmpty, Comment(rawValue: "after the run:\n" + after.differences.joined(separator: "\n")))
        #expect(try daemon.call("GET", "/v1/sessions/closing").0 == 404, "the finishing session goes once its last task ended")
        #expect(try daemon.task(id("P7"))["waiting_reason"]?.stringValue == "scheduled")
        #expect(daemon.terminate() == 0)
    }

    func daemonExpect(_ daemon: DaemonProcess, _ condition: Bool, _ comment: String) {
        #expect(condition, Comment(rawValue: comment + "\n--- daemon log ---\n" + daemon.log()))
    }

    /// Sessions (configuration, state, counts), every task, webhook subscriptions and their
    /// deliveries, the network override and the policy, against v1's answers. On the first look,
    /// the tasks that run by themselves (P10, left running by the SIGKILL; R2, queued) may have
    /// moved on, and pending deliveries may have been delivered. Afterwards only what the test did
    /// not touch is compared.
    func compareWithV1(
        _ fixture: StateFixtureV1, _ daemon: DaemonProcess, _ comparison: inout AnswerComparison,
        firstLook: Bool
    ) throws {
        let api = fixture.api
        // First, P10 (left running by the SIGKILL) and R2 (queued) may already have run; afterwards
        // the tasks the test ran are checked at their servers and left out here.
        let moving: Set<String> =
            firstLook
            ? [fixture.id("P10"), fixture.id("R2")]
            : Set(["P5", "P6", "P8", "P9", "P10", "F2", "Q2", "R1", "R2"].map(fixture.id))
        let progressing: Set<String> = [
            "state", "waiting_reason", "attempts", "started_at", "finished_at", "progress",
            "response", "error", "next_attempt_at",
        ]
        let sessionsMoving: Set<String> = firstLook ? ["plain", "protocols"] : ["plain", "full", "paused", "protocols"]
        let movingStates: Set<String> =
            firstLook
            ? ["queued", "running", "completed"]
            : ["queued", "running", "completed", "waiting", "suspended", "retrying", "auth_required"]

        func compareCounts(_ actual: JSON?, _ expected: JSON?, _ path: String, loose: Bool) {
            guard loose else { return comparison.compare(actual, expected, path) }
            // The tasks that moved went between these states: together they add up the same.
            var sums = (0 as Int64, 0 as Int64)
            for (state, count) in expected?.objectValue ?? [:] {
                if movingStates.contains(state) {
                    sums.0 += count.intValue ?? 0
                    sums.1 += actual?[state]?.intValue ?? 0
                } else {
                    comparison.compare(actual?[state], count, path + "." + state)
                }
            }
            comparison.expect(sums.0 == sums.1, "\(path): \(sums.1) tasks \(movingStates.sorted()), v1 \(sums.0)")
        }

        func compareSession(_ actual: JSON?, _ expected: JSON, _ path: String) {
            let sid = expected["id"]?.stringValue ?? ""
            comparison.compare(
                actual, expected, path, ignoring: firstLook || sid != "paused" ? ["task_counts"] : ["task_counts", "enabled"])
            compareCounts(
                actual?["task_counts"], expected["task_counts"], path + ".task_counts", loose: sessionsMoving.contains(sid))
        }

        let expectedSessions = (api["sessions"]?["sessions"]?.arrayValue ?? []).filter {
            firstLook || $0["id"]?.stringValue != "closing"
        }
        let sessions = try daemon.call("GET", "/v1/sessions").1["sessions"]?.arrayValue ?? []
        comparison.expect(
            sessions.count == expectedSessions.count,
            "GET /v1/sessions: \(sessions.compactMap { $0["id"]?.stringValue }), v1 \(expectedSessions.compactMap { $0["id"]?.stringValue })"
        )
        for expected in expectedSessions {
            let sid = expected["id"]?.stringValue ?? ""
            compareSession(sessions.first { $0["id"]?.stringValue == sid }, expected, "GET /v1/sessions[\(sid)]")
            compareSession(
                try daemon.call("GET", "/v1/sessions/\(sid)").1, api["session"]?[sid] ?? .null, "GET /v1/sessions/\(sid)")

            // Every task, in the listing (creation order) and on its own.
            let listed = try daemon.call("GET", "/v1/sessions/\(sid)/tasks?limit=1000").1["tasks"]?.arrayValue ?? []
            let expectedTasks = api["tasks"]?[sid]?.arrayValue ?? []
            comparison.expect(
                listed.compactMap { $0["id"]?.stringValue } == expectedTasks.compactMap { $0["id"]?.stringValue },
                "GET /v1/sessions/\(sid)/tasks lists \(listed.count) tasks, v1 \(expectedTasks.count), or another order")
            for expectedTask in expectedTasks {
                let tid = expectedTask["id"]?.stringValue ?? ""
                if !firstLook, moving.contains(tid) { continue }
                let ignoring = moving.contains(tid) ? progressing : []
                comparison.compare(
                    listed.first { $0["id"]?.stringValue == tid }, expectedTask, "list \(sid) \(tid)", ignoring: ignoring)
                let single = try daemon.task(tid)
                comparison.compare(single, expectedTask, "GET /v1/tasks/\(tid)", ignoring: ignoring)
                if firstLook, moving.contains(tid) {
                    let state = single["state"]?.stringValue ?? ""
                    comparison.expect(
                        ["queued", "running", "completed"].contains(state),
                        "\(tid): \(state), v1 \(expectedTask["state"]?.stringValue ?? "")")
                }
            }

            comparison.compare(
                try daemon.call("GET", "/v1/sessions/\(sid)/webhooks").1["webhooks"], api["webhooks"]?[sid],
                "GET /v1/sessions/\(sid)/webhooks")
        }

        for (_, webhook) in fixture.manifest["webhooks"]?.objectValue ?? [:] {
            let wid = webhook.stringValue ?? ""
            comparison.compare(try daemon.call("GET", "/v1/webhooks/\(wid)").1, api["webhook"]?[wid], "GET /v1/webhooks/\(wid)")
            let deliveries = try daemon.call("GET", "/v1/webhooks/\(wid)/deliveries?limit=1000").1["deliveries"]?.arrayValue ?? []
            let expected = api["deliveries"]?[wid]?.arrayValue ?? []
            let lastRecorded = expected.compactMap { Int($0["id"]?.stringValue ?? "") }.max() ?? 0
            for delivery in expected {
                let did = delivery["id"]?.stringValue ?? ""
                let actual = deliveries.first { $0["id"]?.stringValue == did }
                let path = "GET /v1/webhooks/\(wid)/deliveries[\(did)]"
                if delivery["state"]?.stringValue == "pending" {
                    // Retried since, maybe delivered: who it is for and what it carries stay.
                    comparison.compare(
                        actual, delivery, path,
                        ignoring: [
                            "state", "attempts", "next_attempt_at", "last_status",
                            "last_error", "attempt_history", "finished_at",
                        ])
                    let states = firstLook ? ["pending", "delivered"] : ["delivered"]
                    comparison.expect(
                        states.contains(actual?["state"]?.stringValue ?? ""),
                        "\(path): \(actual?["state"]?.serialized() ?? "missing"), expected \(states)")
                } else {
                    comparison.compare(actual, delivery, path)
                }
            }
            for delivery in deliveries where Int(delivery["id"]?.stringValue ?? "") ?? 0 <= lastRecorded {
                comparison.expect(
                    expected.contains { $0["id"] == delivery["id"] }, "\(wid): delivery \(delivery.serialized()) is new")
            }
        }

        comparison.compare(try daemon.call("GET", "/v1/network").1, api["network"], "GET /v1/network")
        comparison.compare(try daemon.call("GET", "/v1/policy").1, api["policy"], "GET /v1/policy")
        if firstLook {
            compareCounts(
                try daemon.call("GET", "/v1/info").1["task_counts"], api["info_task_counts"], "GET /v1/info task_counts",
                loose: true)
        }
    }

    /// The retained event log, replayed from the start (`GET /v1/events?after=0`): v1's events
    /// first, in order, each with its id, type, time and data as written.
    func compareEventLog(_ fixture: StateFixtureV1, _ daemon: DaemonProcess, _ comparison: inout AnswerComparison) throws {
        let expected = fixture.api["events"]?.arrayValue ?? []
        var replayed: [(id: Int64, event: String, payload: JSON)] = []
        // The stream stays open: read until v1's events are all there (10 s at most), then stop curl.
        let curl = Process()
        curl.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        curl.arguments = ["-sN", "--max-time", "10", "\(daemon.url)/v1/events?after=0"]
        let output = Pipe()
        curl.standardOutput = output
        try curl.run()
        var text = ""
        eventually(timeout: 10, interval: 0.01) {
            text += String(decoding: output.fileHandleForReading.availableData, as: UTF8.self)
            replayed = Self.serverSentEvents(text)
            return replayed.count >= expected.count || !curl.isRunning
        }
        if curl.isRunning { kill(curl.processIdentifier, SIGKILL) }
        curl.waitUntilExit()
        comparison.expect(
            replayed.count >= expected.count, "the event log replays \(replayed.count) events, v1 kept \(expected.count)")
        for (index, event) in expected.enumerated() where index < replayed.count {
            let actual = replayed[index]
            let path = "event \(event["id"]?.intValue ?? 0)"
            comparison.expect(
                actual.id == event["id"]?.intValue && actual.event == event["event"]?.stringValue,
                "\(path): replayed as \(actual.id) \(actual.event)")
            comparison.compare(actual.payload["type"], event["payload"]?["type"], path + ".type")
            comparison.compare(actual.payload["data"], event["payload"]?["data"], path + ".data", shifted: false)
            comparison.compareTime(
                actual.payload["timestamp"], event["payload"]?["timestamp"]?.stringValue ?? "", path + ".timestamp")
        }
    }

    /// The complete events of a Server-Sent Events text: id, type and parsed data.
    static func serverSentEvents(_ text: String) -> [(id: Int64, event: String, payload: JSON)] {
        var events: [(id: Int64, event: String, payload: JSON)] = []
        for block in text.components(separatedBy: "\n\n").dropLast() {
            var fields: [String: String] = [:]
            for line in block.split(separator: "\n") where !line.hasPrefix(":") {
                if let colon = line.range(of: ": ") {
                    fields[String(line[..<colon.lowerBound])] = String(line[colon.upperBound...])
                }
            }
            guard let id = fields["id"].flatMap({ Int64($0) }), let event = fields["event"], let data = fields["data"] else {
                continue
            }
            events.append((id, event, (try? JSON.parse(data, maxDepth: 64)) ?? .null))
        }
        return events
    }

    /// Today's discretionary budget use came through: `/metrics` shows what is left as v1 did
    /// (unless the local day turned since the fixture was installed, which starts a new budget).
    func compareBudget(_ fixture: StateFixtureV1, _ daemon: DaemonProcess, day: String, _ comparison: inout AnswerComparison) {
        let figures: [String: Double]
        do {
            let exchange = try HTTPClient().send("GET", "\(daemon.url)/metrics")
            figures = try PrometheusParser.parse(String(decoding: exchange.body, as: UTF8.self))
        } catch {
            return comparison.expect(false, "GET /metrics: \(error)")
        }
        guard LocalTime.components(of: Date().timeIntervalSince1970).day == day else { return }
        for (type, left) in fixture.api["budget_remaining"]?.objectValue ?? [:] {
            let shown = figures["backhaul_discretionary_budget_remaining_bytes{network_type=\(type)}"]
            comparison.expect(
                shown.map { Int64($0) } == left.intValue,
                "budget left on \(type): \(shown.map { "\($0)" } ?? "none"), v1 \(left.serialized())")
        }
    }

    /// The raw and multipart uploads at the sink: the exact bytes, with the stored headers.
    func checkUploads(_ fixture: StateFixtureV1, _ sink: RecordingSink) {
        let requests = sink.requests
        func received(_ path: String) -> RecordingSink.Recorded? {
            requests.last { $0.path == path && $0.answered && $0.status == 201 }
        }
        let raw: [(String, String, [String: String])] = [
            ("/plain/retry", "plain-retrying.bin", [:]),
            ("/plain/suspended", "plain-suspended.bin", ["x-secret-token": "p6-token", "x-plain": "p6"]),
            ("/plain/constrained", "plain-constrained.bin", [:]),
            ("/plain/deferred", "plain-deferred.bin", [:]),
            ("/plain/slow", "plain-running.bin", ["proxy-authorization": "Basic cDEwOnNlY3JldA=="]),
            // The session's default headers, the task's own default header, its stored secret and the new token.
            (
                "/full/auth", "full-auth.bin",
                [
                    "authorization": "Bearer renewed-token", "x-request-secret": "f2-request-secret",
                    "x-task-token": "f2-task-token", "x-api-key": "full-api-key", "x-fleet": "camera-3",
                ]
            ),
        ]
        for (path, file, headers) in raw {
            let request = received(path)
            #expect(Bytes(request?.body) == Bytes(fixture.file(file)), "\(path): the body of \(file)")
            for (name, value) in headers { #expect(request?.headers[name] == value, "\(path): \(name)") }
        }
        // Q2: multipart with its field, filename, type and extra fields; the file deleted on success.
        let multipart = received("/paused/multipart")
        let body = multipart?.body ?? Data()
        #expect(body.range(of: fixture.file("paused-waiting.bin")) != nil, "Q2's file inside the multipart body")
        for part in [
            "name=\"clip\"; filename=\"q2.bin\"", "Content-Type: video/mp4", "name=\"camera\"\r\n\r\n3\r\n",
            "name=\"note\"\r\n\r\nfixture v1\r\n",
        ] {
            #expect(body.range(of: Data(part.utf8)) != nil, "Q2's multipart body has \(part)")
        }
        #expect(multipart?.headers["cookie"] == "sid=q2-cookie")
        #expect(!FileManager.default.fileExists(atPath: fixture.filesRoot + "/paused-waiting.bin"), "delete_file_on_success")
    }

    /// The resumable ones went on from where v1 left them: R1 from its checkpoint, R2 from the
    /// tus server's offset (HEAD, no new upload), C2 with Range + If-Range from its checkpoint;
    /// R3's pending cleanup reached the tus server.
    func checkResumedProtocols(_ fixture: StateFixtureV1, sink: RecordingSink, tus: TusServer, downloads: DownloadServer) {
        let manifest = fixture.manifest
        #expect(Bytes(sink.assembled("/protocols/chunked")) == Bytes(fixture.file("protocols-chunked.bin")))
        let stored = manifest["chunked_assembled"]?.intValue ?? -1
        let firstOffsets = sink.requests.filter { $0.path == "/protocols/chunked" }.compactMap { request -> Int64? in
            guard let range = request.headers["content-range"], !range.hasPrefix("bytes */") else { return nil }
            return Int64(range.dropFirst(6).split(separator: "-").first ?? "")
        }
        #expect(firstOffsets.min() == stored, "R1 resumed at \(firstOffsets.min() ?? -1), its checkpoint is \(stored)")
        #expect(sink.requests.filter { $0.path == "/protocols/chunked" && $0.headers["x-upload-key"] != "r1-key" }.isEmpty)

        let r2 = manifest["tus_uploads"]?["R2"]
        let r2Path = "/files/" + (r2?["uid"]?.stringValue ?? "")
        let log = tus.requests
        #expect(!log.contains { $0["method"]?.stringValue == "POST" }, "R2 resumed its upload: no new one was created")
        #expect(log.contains { $0["method"]?.stringValue == "HEAD" && $0["path"]?.stringValue == r2Path })
        let firstPatch = log.first { $0["method"]?.stringValue == "PATCH" && $0["path"]?.stringValue == r2Path }
        #expect(
            firstPatch?["upload_offset"]?.stringValue == String(r2?["stored"]?.intValue ?? -1),
            "R2's first PATCH: \(firstPatch?.serialized() ?? "none")")
        #expect(
            Bytes(FileManager.default.contents(atPath: tus.files + "/" + (r2?["uid"]?.stringValue ?? "")))
                == Bytes(fixture.file("protocols-tus.bin")))
        let r3Path = "/files/" + (manifest["tus_uploads"]?["R3"]?["uid"]?.stringValue ?? "")
        let deleted = eventually(timeout: 30, interval: 0.2) {
            tus.requests.contains {
                $0["method"]?.stringValue == "DELETE" && $0["path"]?.stringValue == r3Path && $0["status"]?.intValue == 204
            }
        }
        #expect(deleted, "R3's pending cleanup: \(tus.requests.map { $0.serialized() })")

        let checkpoint = manifest["db"]?["checkpoints"]?["C2"]
        let served = FileManager.default.contents(atPath: StateFixtureV1.directory + "/peers/served/fw-partial.bin")
        #expect(Bytes(FileManager.default.contents(atPath: fixture.filesRoot + "/downloads/fw-partial.bin")) == Bytes(served))
        #expect(!FileManager.default.fileExists(atPath: fixture.filesRoot + "/downloads/fw-partial.bin.part"))
        let get = downloads.requests.first
        #expect(
            get?["range"]?.stringValue == "bytes=\(checkpoint?["offset"]?.intValue ?? -1)-",
            "C2: \(downloads.requests.map { $0.serialized() })")
        #expect(get?["if_range"]?.stringValue.map { "etag:" + $0 } == checkpoint?["validator"]?.stringValue)
        #expect(get?["status"]?.intValue == 206)
    }

    /// W1's deliveries pending in v1 arrive with their event ids, signed with the rotated secret
    /// and the previous one (its grace period came through), and are then listed delivered.
    func checkWebhooks(_ fixture: StateFixtureV1, _ daemon: DaemonProcess, _ receiver: WebhookReceiver) {
        let wid = fixture.webhook("W1")
        let pending = (fixture.api["deliveries"]?[wid]?.arrayValue ?? []).filter { $0["state"]?.stringValue == "pending" }
            .compactMap { $0["event_id"]?.stringValue }
        #expect(!pending.isEmpty)
        let arrived = eventually(timeout: 30, interval: 0.2) {
            let accepted = receiver.accepted
            return pending.allSatisfy { id in
                accepted.contains { $0["webhook_id"]?.stringValue == id && $0["verified_with"]?.arrayValue?.count == 2 }
            }
        }
        #expect(arrived, "pending deliveries \(pending), received \(receiver.deliveries.map { $0.serialized() })")
        let listed = eventually(timeout: 10, interval: 0.2) {
            let deliveries =
                (try? daemon.call("GET", "/v1/webhooks/\(wid)/deliveries?state=delivered&limit=1000").1["deliveries"]?.arrayValue)
                ?? []
            return pending.allSatisfy { id in deliveries.contains { $0["event_id"]?.stringValue == id } }
        }
        #expect(listed, "the pending deliveries are listed delivered")
    }
}
