import BackhaulCore
import BackhaulTesting
import Digest
import Foundation
import Glibc
import JSONCodec
import Testing

/// The soak (issue 20, docs/uptime.md): mixed load for `BACKHAUL_SOAK_SECONDS` (default 120, the form
/// `make test` runs; `make soak` sets 1800) against every kind of peer at once, with a webhook
/// consumer down for a third of the run, a server failing 20 % of its requests and SIGKILLs on a
/// schedule. It samples the daemon's resources, API latency and event lag, asserts that nothing
/// was lost and that the resources at the end are where they settled, prints a table and writes
/// `bench-results/soak-<seconds>.json` and `.md`. The schedule and the rules are in `SoakPlan`.
@Suite("Soak")
struct SoakTests {
    @Test(
        "soak: every protocol, downloads, a flaky server, a webhook consumer down for a third of the run, SIGKILLs; nothing lost, resources flat"
    )
    func soak() throws {
        let plan = SoakPlan(duration: SoakPlan.durationFromEnvironment)
        let run = try SoakRun(plan: plan)
        try run.load()
        try run.drain()
        let outcome = run.verify()
        let report = run.report(outcome)
        print(report.table)
        report.write()
        run.fixture.expectLog(run.unexpectedExits.isEmpty, "the daemon exited without being killed: \(run.unexpectedExits)")
        #expect(run.refused.isEmpty, "enqueues refused: \(run.refused.prefix(5))")
        #expect(
            outcome.problems.isEmpty,
            "lost or wrong (\(outcome.problems.count)): \(outcome.problems.prefix(12).joined(separator: "\n"))")
        #expect(
            outcome.undelivered.isEmpty,
            "final events never delivered (\(outcome.undelivered.count)): \(outcome.undelivered.prefix(12))")
        for check in report.checks where !check.passed {
            Issue.record("\(check.name): settled \(check.settled), end \(check.end), allowed up to \(check.limit) (\(plan.rule))")
        }
        for bound in report.bounds where !bound.passed {
            Issue.record("\(bound.name): \(bound.value), bound \(bound.limit)")
        }
        #expect(run.fixture.daemon.terminate() == 0, "SIGTERM at the end")
    }
}

/// What the soak does when, scaled from its duration `D` (seconds). Both forms keep the same
/// shape: a wave of seven tasks (one per protocol and a download) every 3 s; resources sampled
/// every second (short form) or 5 s (long); the webhook consumer down from D/3 to 2D/3;
/// SIGKILLs every ~D/10 (at least 40 s, at most 3 min) between the settled point and the end.
///
/// Comparing like with like across SIGKILLs: a restarted daemon starts small again, so the
/// kills are placed backwards from `D − D/6` — the last process has run exactly D/6 when the
/// load ends, as long as the first had when it settled. The figures of a phase are medians (RSS,
/// descriptors, threads, state size) or percentiles (latency, lag) over a window of D/12 seconds:
/// `start` = [0, D/12], `settled` = [D/12, D/6], `end` = [D − D/12, D]. No kill falls inside
/// those windows, and each window covers the same span of process age as its counterpart.
struct SoakPlan {
    let duration: Double

    static var durationFromEnvironment: Double {
        ProcessInfo.processInfo.environment["BACKHAUL_SOAK_SECONDS"].flatMap(Double.init).map { max(60, $0) } ?? 120
    }

    var isLong: Bool { duration >= 600 }
    let waveInterval = 3.0
    var sampleInterval: Double { isLong ? 5 : 1 }
    /// Latency probes per sample: half `GET /v1/tasks/{id}` (a task of the last waves), half
    /// `GET /v1/sessions`.
    let probesPerSample = 20
    var window: Double { duration / 12 }
    var settledAt: Double { duration / 6 }
    var startWindow: ClosedRange<Double> { 0...window }
    var settledWindow: ClosedRange<Double> { (settledAt - window)...settledAt }
    var endWindow: ClosedRange<Double> { (duration - window)...duration }
    var outage: ClosedRange<Double> { (duration / 3)...(2 * duration / 3) }
    var killInterval: Double { min(180, max(40, duration / 10)) }

    /// Backwards from D − D/6 every `killInterval`, while clear of the settled window.
    var kills: [Double] {
        var times: [Double] = []
        var time = duration - settledAt
        while time > settledAt + killInterval / 2 {
            times.insert(time, at: 0)
            time -= killInterval
        }
        return times
    }

    /// Finished tasks are kept this long: short enough that the number kept has levelled off
    /// by the settled window (the short form's D/12 = 10 s), so the state measures the service's
    /// own footprint, not a table still filling.
    var retention: Int { Int(min(60, duration / 12)) }

    /// The webhook retry schedule: quick first retries, then every 20 s, 50 attempts in all
    /// (918 s): an event created as the consumer goes away is still being retried when it comes
    /// back even in the long form (600 s away), and the backlog is sent within 20 s of its return.
    /// (The daemon's own default waits 5 min, then 30 min: a 10-minute outage would leave the
    /// backlog for after the run.)
    var webhookSchedule: String { (["0", "1", "2", "5", "10"] + Array(repeating: "20", count: 45)).joined(separator: ",") }

    /// After the load: how long the remaining tasks and deliveries may take.
    var drainTimeout: Double { isLong ? 900 : 240 }

    /// End against settled, for RSS, descriptors, threads and the state directory. The long
    /// form is the issue's rule: at most 10 % above (lower passes). Two minutes cannot tell a slow
    /// leak from warm-up, and `make test` runs the short form beside the other end-to-end tests
    /// on the same two cores, so it allows a quarter more plus a small absolute slack (a few
    /// transfers more in flight at the end, a malloc arena): a descriptor or a thread per task
    /// (~45 tasks in the last life alone) still fails it, and `keptLimit` catches tasks that are
    /// never pruned (the 4 MiB WAL would hide their pages in the state directory's size).
    var rule: String {
        isLong ? "end ≤ settled × 1.10" : "end ≤ settled × 1.25 + slack (RSS 4 MiB, descriptors 8, threads 2, state 1 MiB)"
    }

    static let slack: [String: Double] = ["RSS": 4, "open descriptors": 8, "threads": 2, "state directory": 1]

    func limit(_ name: String, settled: Double) -> Double {
        isLong ? settled * 1.10 : settled * 1.25 + (Self.slack[name] ?? 0)
    }

    /// Whatever the form: retention keeps up, so the tasks kept at the end (finished ones waiting
    /// out their retention, and those in flight) are not many more than when settled.
    func keptLimit(settled: Double) -> Double { settled * 1.5 + 10 }

    /// Sanity bounds on the end window whatever the form (a service that answers in seconds or
    /// delivers late has failed even if it leaked nothing).
    let apiP99Bound = 1.0
    let eventLagP99Bound = 5.0
}

/// One uploaded or downloaded file of the soak.
struct SoakTask {
    enum Kind: String, CaseIterable {
        case raw, multipart, chunked, tus, s3, ietf, download
    }

    var tag: String
    var id: String
    var kind: Kind
    var poolFile: String
    var enqueuedAt: Double
}

/// The soak's peers, daemon, load and measurements.
final class SoakRun {
    struct Sample {
        var time: Double
        var age: Double
        var pid: Int32
        var rssKiB: Double
        var descriptors: Double
        var threads: Double
        var stateBytes: Double
        var databaseBytes: Double
        var walBytes: Double
        var kept: Double
    }

    let plan: SoakPlan
    let fixture: Fixture
    let tus: TusServer
    let s3: S3Server
    let ietf: IETFServer
    let nginx: NginxServer
    let receiver: WebhookReceiver
    let secret = WebhookRecordSecret.fixed
    let session = "soak"
    /// Pool files by name, with their SHA-256.
    var pool: [(name: String, path: String, digest: [UInt8])] = []
    var digests: [String: [UInt8]] = [:]
    var tasks: [SoakTask] = []
    var refused: [String] = []
    var samples: [Sample] = []
    var latencies: [(time: Double, seconds: Double)] = []
    var killsDone: [Double] = []
    var unexpectedExits: [String] = []
    var processStartedAt = 0.0
    var startedAt = Date()
    var loadEndedAt = 0.0
    var drainedAt = 0.0
    var drainedSample: Sample?
    var databasePages: (pages: Int, free: Int, size: Int)?
    var consumerAwayAt: Double?
    var consumerBackAt: Double?

    init(plan: SoakPlan) throws {
        self.plan = plan
        let fixture = try Fixture(
            daemonArguments: [
                "--finished-task-retention", String(plan.retention),
                "--webhook-retry-schedule", plan.webhookSchedule,
            ],
            sink: .flaky(rate: 0.2, seed: UInt64.random(in: 1...UInt64.max), stall: 2, then: .resumable))
        self.fixture = fixture
        tus = try TusServer(directory: fixture.scratch.path)
        s3 = try S3Server(directory: fixture.scratch.path)
        ietf = try IETFServer(directory: fixture.scratch.path)
        nginx = try NginxServer(directory: fixture.scratch.file("nginx"))
        receiver = try WebhookReceiver(directory: fixture.scratch.path, secrets: [WebhookRecordSecret.fixed])
        try FileManager.default.createDirectory(atPath: fixture.data + "/dl", withIntermediateDirectories: true)
        let sizes = [
            ("p0.bin", 4 << 10), ("p1.bin", 48 << 10), ("p2.bin", 300 << 10), ("p3.bin", 1 << 20), ("p4.bin", 2 << 20),
            ("p5.bin", 6 << 20),
        ]
        for (name, size) in sizes {
            let path = fixture.makeFile(name, size: size)
            try FileManager.default.copyItem(atPath: path, toPath: nginx.root + "/" + name)
            let digest = SHA256Hasher.digest(Array(fixture.contents(path)))
            pool.append((name, path, digest))
            digests[name] = digest
        }
        try fixture.session(
            session,
            [
                "retry": ["initial_backoff": 0.2, "max_backoff": 2], "timeout_interval_for_request": 10,
                "max_connections_per_host": 8,
            ])
        _ = try fixture.subscribe(
            receiver.url, secret: secret, events: ["task.completed", "task.failed", "task.cancelled"],
            session: session)
    }

    var daemon: DaemonProcess { fixture.daemon }
    func elapsed() -> Double { Date().timeIntervalSince(startedAt) }

    // MARK: The load

    func load() throws {
        startedAt = Date()
        processStartedAt = 0
        var nextWave = 0.0
        var nextSample = 0.0
        var wave = 0
        var pendingKills = plan.kills
        var consumer = "up"
        while elapsed() < plan.duration {
            let now = elapsed()
            if let kill = pendingKills.first, now >= kill {
                pendingKills.removeFirst()
                daemon.kill9()
                killsDone.append(elapsed())
                try daemon.start()
                processStartedAt = elapsed()
                continue
            }
            if consumer == "up", now >= plan.outage.lowerBound {
                receiver.stop()
                consumerAwayAt = elapsed()
                consumer = "down"
            } else if consumer == "down", now >= plan.outage.upperBound {
                try receiver.start()
                consumerBackAt = elapsed()
                consumer = "back"
            }
            if !daemon.isRunning {
                let status = daemon.exitStatus.map(String.init) ?? "?"
                unexpectedExits.append("at \(Int(now)) s, status \(status): \(daemon.log(lastLines: 5))")
                try daemon.start()
                processStartedAt = elapsed()
            }
            if now >= nextWave {
                enqueueWave(wave)
                wave += 1
                nextWave = max(nextWave + plan.waveInterval, elapsed() - plan.waveInterval)
            }
            if now >= nextSample {
                if let sample = sample() { samples.append(sample) }
                probeLatency()
                nextSample = max(nextSample + plan.sampleInterval, elapsed() - plan.sampleInterval)
            }
            let next = min(nextWave, nextSample, pendingKills.first ?? .infinity, plan.duration)
            let pause = min(0.1, max(0, next - elapsed()))
            if pause > 0 { Thread.sleep(forTimeInterval: pause) }
        }
        loadEndedAt = elapsed()
        if consumer == "down" {
            try receiver.start()
            consumerBackAt = elapsed()
        }
    }

    /// Seven tasks: one per upload protocol and a download, sizes rotating through the pool
    /// (4 KiB to 2 MiB; every tenth S3 task 6 MiB, which goes as a multipart upload).
    func enqueueWave(_ wave: Int) {
        for (index, kind) in SoakTask.Kind.allCases.enumerated() {
            var file = pool[(wave + index) % 5]
            if kind == .s3, wave % 10 == 3 { file = pool[5] }
            let tag = "w\(wave)-\(kind.rawValue)"
            var object: JSONObject = ["idempotency_key": .string(tag), "description": .string("soak \(tag)")]
            switch kind {
            case .raw:
                object["request"] = ["url": .string(fixture.sink.url("/raw/\(tag)")), "method": "PUT"]
            case .multipart:
                object["request"] = ["url": .string(fixture.sink.url("/form/\(tag)")), "method": "POST"]
                object["upload"] = [
                    "protocol": "multipart", "field": "file", "filename": .string("\(tag).bin"),
                    "fields": ["tag": .string(tag)],
                ]
            case .chunked:
                object["request"] = ["url": .string(fixture.sink.url("/chunked/\(tag)")), "method": "PUT"]
                object["upload"] = ["protocol": "chunked", "chunk_size": 524_288]
            case .tus:
                object["request"] = ["url": .string(tus.creationURL), "method": "POST"]
                object["upload"] = [
                    "protocol": "tus", "chunk_size": 524_288, "filename": .string("\(tag).bin"),
                    "content_type": "application/octet-stream",
                ]
            case .s3:
                object["request"] = ["url": .string(s3.objectURL("soak/\(tag).bin")), "method": "PUT"]
                object["upload"] = ["protocol": "s3", "chunk_size": .int(5 << 20)]
                object["s3"] = s3.taskCredentials
            case .ietf:
                object["request"] = ["url": .string(ietf.url("/up/\(tag).bin")), "method": "POST"]
                object["upload"] = ["protocol": "ietf"]
            case .download:
                object["kind"] = "download"
                object["request"] = ["url": .string(nginx.url("/\(file.name)"))]
                object["destination"] = .string("\(fixture.data)/dl/\(tag).bin")
                object["expected_sha256"] = .string(SHA256Hasher.hex(file.digest))
            }
            if kind != .download { object["file"] = .string(file.path) }
            do {
                let (status, body) = try daemon.call("POST", "/v1/sessions/\(session)/tasks", .object(object))
                if status == 201, let id = body["id"]?.stringValue {
                    tasks.append(SoakTask(tag: tag, id: id, kind: kind, poolFile: file.name, enqueuedAt: elapsed()))
                } else {
                    refused.append("\(tag): \(status) \(body.serialized())")
                }
            } catch {
                refused.append("\(tag): \(error)")
            }
        }
    }

    // MARK: Measurements

    /// The daemon's RSS, descriptors and threads from /proc, the state directory's size, and how
    /// many tasks it keeps; nil if the process went away between the reads.
    func sample() -> Sample? {
        let pid = daemon.pid
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let descriptors = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count
        else { return nil }
        func field(_ name: String) -> Double {
            let line = status.split(separator: "\n").first { $0.hasPrefix(name + ":") } ?? ""
            return Double(line.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first ?? "") ?? -1
        }
        var state = 0.0
        var database = 0.0
        var wal = 0.0
        let directory = daemon.stateDirectory
        if let enumerator = FileManager.default.enumerator(atPath: directory) {
            while let name = enumerator.nextObject() as? String {
                guard let attributes = try? FileManager.default.attributesOfItem(atPath: directory + "/" + name),
                    attributes[.type] as? FileAttributeType == .typeRegular,
                    let size = (attributes[.size] as? NSNumber)?.doubleValue
                else { continue }
                state += size
                if name == "backhaul.db" { database = size }
                if name == "backhaul.db-wal" { wal = size }
            }
        }
        let counts = (try? daemon.call("GET", "/v1/sessions/\(session)").1["task_counts"]?.objectValue) ?? [:]
        let kept = counts.reduce(0.0) { $0 + ($1.value.doubleValue ?? 0) }
        let now = elapsed()
        return Sample(
            time: now, age: now - processStartedAt, pid: pid, rssKiB: field("VmRSS"), descriptors: Double(descriptors),
            threads: field("Threads"), stateBytes: state, databaseBytes: database, walBytes: wal, kept: kept)
    }

    /// A burst of API reads, each timed from the client.
    func probeLatency() {
        let recent = tasks.suffix(14)
        for index in 0..<plan.probesPerSample {
            let path =
                index % 2 == 0 && !recent.isEmpty
                ? "/v1/tasks/\(recent[recent.startIndex + (index / 2) % recent.count].id)" : "/v1/sessions"
            let began = DispatchTime.now()
            guard (try? daemon.call("GET", path)) != nil else { continue }
            let seconds = Double(DispatchTime.now().uptimeNanoseconds - began.uptimeNanoseconds) / 1e9
            latencies.append((elapsed(), seconds))
        }
    }

    // MARK: After the load

    /// Waits (bounded) until no task of the session is unfinished and every task's final event
    /// reached the consumer.
    func drain() throws {
        let deadline = Date().addingTimeInterval(plan.drainTimeout)
        let unfinished = ["queued", "waiting", "running", "retrying", "suspended", "auth_required"]
        let ids = Set(tasks.map(\.id))
        while Date() < deadline {
            if !daemon.isRunning {
                unexpectedExits.append("while draining, status \(daemon.exitStatus.map(String.init) ?? "?")")
                try daemon.start()
            }
            let counts = (try? daemon.call("GET", "/v1/sessions/\(session)").1["task_counts"]) ?? .null
            let open = unfinished.reduce(Int64(0)) { $0 + (counts[$1]?.intValue ?? 0) }
            if counts != .null, open == 0, Set(finalDeliveries().keys).isSuperset(of: ids) { break }
            Thread.sleep(forTimeInterval: 1)
        }
        drainedAt = elapsed()
        drainedSample = sample()
        databasePages = pageCounts()
    }

    /// The database's pages and free pages (read beside the running daemon, which WAL allows).
    func pageCounts() -> (pages: Int, free: Int, size: Int)? {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [
            "python3", "-c",
            """
            import sqlite3, sys
            db = sqlite3.connect("file:" + sys.argv[1] + "?mode=ro", uri=True)
            print(*[db.execute("PRAGMA " + name).fetchone()[0] for name in ("page_count", "freelist_count", "page_size")])
            """, daemon.stateDirectory + "/backhaul.db",
        ]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return nil }
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let numbers = text.split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
        return numbers.count == 3 ? (numbers[0], numbers[1], numbers[2]) : nil
    }

    /// The first accepted final event of each task, by task id.
    func finalDeliveries() -> [String: JSON] {
        var first: [String: JSON] = [:]
        for delivery in receiver.accepted {
            guard let type = delivery["type"]?.stringValue, type.hasPrefix("task."), let id = delivery["task_id"]?.stringValue,
                first[id] == nil
            else { continue }
            first[id] = delivery
        }
        return first
    }

    struct Outcome {
        var completed: [SoakTask.Kind: Int] = [:]
        var problems: [String] = []
        var undelivered: [String] = []
        var deliveries = 0
        var webhookIDs = 0
        var redelivered = 0
        var lags: [(time: Double, seconds: Double)] = []
        /// Final events of tasks that finished while the consumer was away, and how long after
        /// its return the last of them arrived.
        var backlog = 0
        var backlogCaughtUp: Double?
        var faults: [String: Int] = [:]
    }

    /// Every task completed (by its final event, or by GET where the event is missing), and its
    /// bytes are at its server, byte for byte.
    func verify() -> Outcome {
        var outcome = Outcome()
        let accepted = receiver.accepted
        outcome.deliveries = accepted.count
        var seen: [String: Int] = [:]
        for delivery in accepted { seen[delivery["webhook_id"]?.stringValue ?? "", default: 0] += 1 }
        outcome.webhookIDs = seen.count
        outcome.redelivered = seen.values.filter { $0 > 1 }.count
        let finals = finalDeliveries()
        for delivery in finals.values where delivery["type"]?.stringValue == "task.completed" {
            guard let finished = delivery["finished_at"]?.stringValue.flatMap(RFC3339.parse),
                let received = delivery["received_at"]?.doubleValue
            else { continue }
            outcome.lags.append((finished - startedAt.timeIntervalSince1970, received - finished))
            let finishedAt = finished - startedAt.timeIntervalSince1970
            if let back = consumerBackAt, let away = consumerAwayAt, (away...back).contains(finishedAt) {
                outcome.backlog += 1
                outcome.backlogCaughtUp = max(outcome.backlogCaughtUp ?? 0, received - startedAt.timeIntervalSince1970 - back)
            }
        }
        let requests = Dictionary(grouping: fixture.sink.requests, by: \.path)
        let tusUploads = tus.uploadsByFilename
        outcome.faults = fixture.sink.faults
        for task in tasks {
            var state = finals[task.id]?["state"]?.stringValue
            if state == nil {
                outcome.undelivered.append("\(task.tag) \(task.id)")
                state = (try? daemon.task(task.id))?["state"]?.stringValue ?? "gone"
            }
            guard state == "completed" else {
                outcome.problems.append("\(task.tag) \(task.id): \(state ?? "?")")
                continue
            }
            let expected = digests[task.poolFile] ?? []
            var received: [Data] = []
            switch task.kind {
            case .raw:
                received = (requests["/raw/\(task.tag)"] ?? []).filter { $0.answered && $0.status == 201 }.suffix(1).map(\.body)
            case .multipart:
                if let request = (requests["/form/\(task.tag)"] ?? []).last(where: { $0.answered && $0.status == 201 }),
                    let boundary = request.headers["content-type"]?.components(separatedBy: "boundary=").last
                {
                    received = Multipart.parse(request.body, boundary: boundary).filter { $0.name == "file" }.map(\.body)
                }
            case .chunked: received = [fixture.sink.assembled("/chunked/\(task.tag)")]
            case .tus: received = (tusUploads["\(task.tag).bin"] ?? []).map { fixture.contents($0) }
            case .s3: received = [s3.object("soak/\(task.tag).bin")]
            case .ietf:
                received = ietf.uploads.filter { $0.hasSuffix("/\(task.tag).bin") || $0.contains("/\(task.tag).bin.") }
                    .map { fixture.contents($0) }
            case .download:
                received = [fixture.contents("\(fixture.data)/dl/\(task.tag).bin")]
                if FileManager.default.fileExists(atPath: "\(fixture.data)/dl/\(task.tag).bin.part") {
                    outcome.problems.append("\(task.tag): a .part file was left")
                }
            }
            if received.contains(where: { SHA256Hasher.digest(Array($0)) == expected }) {
                outcome.completed[task.kind, default: 0] += 1
            } else {
                let held = received.map { "\($0.count) bytes" }
                outcome.problems.append("\(task.tag) \(task.id): the server holds \(held) of \(task.poolFile)")
            }
        }
        return outcome
    }

    // MARK: The report

    func report(_ outcome: Outcome) -> SoakReport { SoakReport(run: self, outcome: outcome) }
}

/// Figures by phase, the checks against the plan's rule, the table and the files.
struct SoakReport {
    struct Row {
        var name: String
        var unit: String
        var start: Double
        var settled: Double
        var end: Double
        var drained: Double?
    }

    struct Check {
        var name: String
        var settled: Double
        var end: Double
        var limit: Double
        var passed: Bool
    }

    struct Bound {
        var name: String
        var value: Double
        var limit: Double
        var passed: Bool
    }

    /// A daemon's life: its first and last samples.
    typealias Life = (pid: Int32, first: SoakRun.Sample, last: SoakRun.Sample)

    let duration: Int
    var rows: [Row] = []
    var checks: [Check] = []
    var bounds: [Bound] = []
    var lives: [Life] = []
    var table = ""
    var json: JSON = .null

    init(run: SoakRun, outcome: SoakRun.Outcome) {
        let plan = run.plan
        duration = Int(plan.duration)
        let windows = [plan.startWindow, plan.settledWindow, plan.endWindow]
        func resource(_ name: String, _ unit: String, scale: Double = 1, _ value: (SoakRun.Sample) -> Double) -> Row {
            let phases = windows.map { window in
                Self.percentile(run.samples.filter { window.contains($0.time) }.map(value), 0.5) / scale
            }
            return Row(
                name: name, unit: unit, start: phases[0], settled: phases[1], end: phases[2],
                drained: run.drainedSample.map(value).map { $0 / scale })
        }
        func timed(
            _ name: String, _ unit: String, _ items: [(time: Double, seconds: Double)], _ fraction: Double,
            scale: Double = 1
        ) -> Row {
            let phases = windows.map { window in
                Self.percentile(items.filter { window.contains($0.time) }.map(\.seconds), fraction) * scale
            }
            return Row(name: name, unit: unit, start: phases[0], settled: phases[1], end: phases[2])
        }
        let rss = resource("RSS", "MiB", scale: 1024, \.rssKiB)
        let descriptors = resource("open descriptors", "", \.descriptors)
        let threads = resource("threads", "", \.threads)
        let state = resource("state directory", "MiB", scale: 1_048_576, \.stateBytes)
        let kept = resource("tasks kept (all states)", "", \.kept)
        let apiP99 = timed("API p99 (GET task, GET sessions)", "ms", run.latencies, 0.99, scale: 1000)
        let lagP99 = timed("event lag p99 (finished → webhook)", "s", outcome.lags, 0.99)
        rows = [
            rss, descriptors, threads, state,
            resource("  of which backhaul.db", "MiB", scale: 1_048_576, \.databaseBytes),
            resource("  of which the WAL", "MiB", scale: 1_048_576, \.walBytes),
            kept,
            timed("API p50 (GET task, GET sessions)", "ms", run.latencies, 0.5, scale: 1000), apiP99,
            timed("event lag p50 (finished → webhook)", "s", outcome.lags, 0.5), lagP99,
        ]
        for row in [rss, descriptors, threads, state] {
            let limit = plan.limit(row.name, settled: row.settled)
            checks.append(Check(name: row.name, settled: row.settled, end: row.end, limit: limit, passed: row.end <= limit))
        }
        let keptLimit = plan.keptLimit(settled: kept.settled)
        checks.append(
            Check(
                name: kept.name, settled: kept.settled, end: kept.end, limit: keptLimit,
                passed: kept.end <= keptLimit))
        bounds = [
            Bound(
                name: "API p99 at the end (s)", value: apiP99.end / 1000, limit: plan.apiP99Bound,
                passed: !(apiP99.end / 1000 > plan.apiP99Bound)),
            Bound(
                name: "event lag p99 at the end (s)", value: lagP99.end, limit: plan.eventLagP99Bound,
                passed: !(lagP99.end > plan.eventLagP99Bound)),
        ]
        // Each life at its last sample (before its SIGKILL, or the end): lives that end bigger
        // and bigger grow with what they carry over (the state), not within one life.
        for sample in run.samples {
            if let index = lives.indices.last, lives[index].pid == sample.pid {
                lives[index].last = sample
            } else {
                lives.append((sample.pid, sample, sample))
            }
        }
        table = markdown(run: run, outcome: outcome)
        json = document(run: run, outcome: outcome)
    }

    /// Nearest rank: the smallest value with at least `fraction` of them at or below it.
    static func percentile(_ values: [Double], _ fraction: Double) -> Double {
        guard !values.isEmpty else { return .nan }
        let rank = Int((Double(values.count) * fraction).rounded(.up))
        return values.sorted()[min(values.count, max(1, rank)) - 1]
    }

    static func format(_ value: Double?, _ unit: String) -> String {
        guard let value, !value.isNaN else { return "–" }
        switch unit {
        case "MiB", "ms": return String(format: "%.1f", value)
        case "s": return String(format: "%.2f", value)
        default: return String(format: "%.0f", value)
        }
    }

    /// What happened, in one paragraph.
    static func summary(run: SoakRun, outcome: SoakRun.Outcome) -> String {
        let plan = run.plan
        let verified = SoakTask.Kind.allCases.map { "\($0.rawValue) \(outcome.completed[$0] ?? 0)" }.joined(separator: ", ")
        let faults = outcome.faults.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        let caughtUp = outcome.backlogCaughtUp.map { String(format: "%.1f", $0) } ?? "–"
        let pages = run.databasePages.map { "\($0.pages) pages of \($0.size) bytes, \($0.free) of them free" } ?? "? pages"
        return [
            "soak \(Int(plan.duration)) s: \(run.tasks.count) tasks accepted (\(verified) verified),",
            "\(outcome.problems.count) lost or wrong, \(outcome.undelivered.count) final events undelivered;",
            "\(run.killsDone.count) SIGKILLs at \(run.killsDone.map { String(Int($0)) }.joined(separator: ", ")) s;",
            "consumer down \(Int(plan.outage.lowerBound))–\(Int(plan.outage.upperBound)) s,",
            "its backlog of \(outcome.backlog) final events all in \(caughtUp) s after its return;",
            "sink faults \(outcome.faults.values.reduce(0, +)) (\(faults));",
            "\(outcome.deliveries) webhook deliveries accepted for \(outcome.webhookIDs) webhook-ids",
            "(\(outcome.redelivered) delivered more than once);",
            "drained \(Int(run.drainedAt - run.loadEndedAt)) s after the load, when backhaul.db had \(pages)",
        ].joined(separator: " ")
    }

    func markdown(run: SoakRun, outcome: SoakRun.Outcome) -> String {
        let plan = run.plan
        func span(_ window: ClosedRange<Double>) -> String { "\(Int(window.lowerBound))–\(Int(window.upperBound)) s" }
        var lines = [
            Self.summary(run: run, outcome: outcome),
            "windows: start \(span(plan.startWindow)), settled \(span(plan.settledWindow)), end \(span(plan.endWindow))"
                + " (medians; latency and lag percentiles); drained = after the load, all delivered",
            "",
            "| figure | start | settled | end | end ÷ settled | drained |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for row in rows {
            let name = row.unit.isEmpty ? row.name : "\(row.name) (\(row.unit))"
            let ratio = row.settled > 0 && !row.end.isNaN ? String(format: "%.2f", row.end / row.settled) : "–"
            let figures = [row.start, row.settled, row.end].map { Self.format($0, row.unit) }
            lines.append("| \(name) | \(figures.joined(separator: " | ")) | \(ratio) | \(Self.format(row.drained, row.unit)) |")
        }
        lines += [
            "", "| process | from s | to s | RSS (MiB) | descriptors | threads | state (MiB) | tasks kept |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for (index, life) in lives.enumerated() {
            let last = life.last
            let cells = [
                "\(index + 1)", "\(Int(life.first.time - life.first.age))", "\(Int(last.time))",
                Self.format(last.rssKiB / 1024, "MiB"), "\(Int(last.descriptors))", "\(Int(last.threads))",
                Self.format(last.stateBytes / 1_048_576, "MiB"), "\(Int(last.kept))",
            ]
            lines.append("| \(cells.joined(separator: " | ")) |")
        }
        let verdicts =
            checks.map { check in
                let unit = check.name == "RSS" || check.name == "state directory" ? "MiB" : ""
                return "\(check.name) \(check.passed ? "ok" : "FAILED") (≤ \(Self.format(check.limit, unit)))"
            } + bounds.map { "\($0.name) \($0.passed ? "ok" : "FAILED") (≤ \($0.limit))" }
        lines += ["", "rule (\(plan.isLong ? "long" : "short") form): \(plan.rule): \(verdicts.joined(separator: ", "))"]
        return lines.joined(separator: "\n")
    }

    func document(run: SoakRun, outcome: SoakRun.Outcome) -> JSON {
        let plan = run.plan
        func number(_ value: Double?) -> JSON {
            guard let value, value.isFinite else { return .null }
            return .double((value * 1000).rounded() / 1000)
        }
        func pair(_ window: ClosedRange<Double>) -> JSON { [number(window.lowerBound), number(window.upperBound)] }
        func counts<Key>(_ dictionary: [Key: Int], _ name: (Key) -> String) -> JSON {
            .object(JSONObject(dictionary.map { (name($0.key), JSON.int(Int64($0.value))) }.sorted { $0.0 < $1.0 }))
        }
        func strings(_ values: [String]) -> JSON { .array(values.map { .string($0) }) }
        return [
            "duration_seconds": .int(Int64(duration)),
            "plan": [
                "wave_interval": number(plan.waveInterval), "sample_interval": number(plan.sampleInterval),
                "retention_seconds": .int(Int64(plan.retention)), "webhook_retry_schedule": .string(plan.webhookSchedule),
                "consumer_down": pair(plan.outage), "kills_planned": .array(plan.kills.map { number($0) }),
                "kills_done": .array(run.killsDone.map { number($0) }),
                "windows": ["start": pair(plan.startWindow), "settled": pair(plan.settledWindow), "end": pair(plan.endWindow)],
                "rule": .string(plan.rule),
            ],
            "tasks": [
                "accepted": .int(Int64(run.tasks.count)), "refused": strings(run.refused),
                "verified": counts(outcome.completed, \.rawValue), "lost_or_wrong": strings(outcome.problems),
                "undelivered_final_events": strings(outcome.undelivered),
            ],
            "webhooks": [
                "deliveries_accepted": .int(Int64(outcome.deliveries)), "webhook_ids": .int(Int64(outcome.webhookIDs)),
                "delivered_more_than_once": .int(Int64(outcome.redelivered)),
                "backlog_final_events": .int(Int64(outcome.backlog)),
                "backlog_last_arrived_after_return_seconds": number(outcome.backlogCaughtUp),
            ],
            "sink_faults": counts(outcome.faults, { $0 }),
            "unexpected_exits": strings(run.unexpectedExits),
            "drained_after_seconds": number(run.drainedAt - run.loadEndedAt),
            "database_when_drained": run.databasePages.map {
                ["pages": .int(Int64($0.pages)), "free_pages": .int(Int64($0.free)), "page_size": .int(Int64($0.size))]
            } ?? .null,
            "figures": .array(
                rows.map { row in
                    [
                        "name": .string(row.name.trimmingCharacters(in: .whitespaces)), "unit": .string(row.unit),
                        "start": number(row.start), "settled": number(row.settled), "end": number(row.end),
                        "drained": number(row.drained),
                    ]
                }),
            "checks": .array(
                checks.map { check in
                    [
                        "name": .string(check.name), "settled": number(check.settled), "end": number(check.end),
                        "limit": number(check.limit), "passed": .bool(check.passed),
                    ]
                }),
            "bounds": .array(
                bounds.map { bound in
                    [
                        "name": .string(bound.name), "value": number(bound.value), "limit": number(bound.limit),
                        "passed": .bool(bound.passed),
                    ]
                }),
            "lives": .array(
                lives.map { life in
                    [
                        "pid": .int(Int64(life.pid)), "started": number(life.first.time - life.first.age),
                        "last_sample": number(life.last.time), "rss_kib": number(life.last.rssKiB),
                        "fds": number(life.last.descriptors),
                        "threads": number(life.last.threads), "state_bytes": number(life.last.stateBytes),
                        "tasks_kept": number(life.last.kept),
                    ]
                }),
            "latency_probes": .int(Int64(run.latencies.count)),
            "samples": .array(
                run.samples.map { sample in
                    [
                        "t": number(sample.time), "age": number(sample.age), "pid": .int(Int64(sample.pid)),
                        "rss_kib": number(sample.rssKiB), "fds": number(sample.descriptors), "threads": number(sample.threads),
                        "state_bytes": number(sample.stateBytes), "db_bytes": number(sample.databaseBytes),
                        "wal_bytes": number(sample.walBytes), "tasks_kept": number(sample.kept),
                    ]
                }),
        ]
    }

    /// `bench-results/soak-<seconds>.json` and `.md` at the package root.
    func write() {
        let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("bench-results")
        try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let name = directory.appendingPathComponent("soak-\(duration)")
        try? json.serialized().write(to: name.appendingPathExtension("json"), atomically: true, encoding: .utf8)
        try? (table + "\n").write(to: name.appendingPathExtension("md"), atomically: true, encoding: .utf8)
    }
}
