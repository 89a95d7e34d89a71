import BackhaulCore
import BackhaulTesting
import Curl
import Digest
import Foundation
import JSONCodec
import Testing

/// Hostile peers (issue 49, docs/security.md): every protocol's real peer behind a proxy that
/// lies in a third of its answers (`HostileProxy`), waves of tasks for `BACKHAUL_HOSTILE_SECONDS`
/// (default 40, the form `make test` runs; longer by hand), seed `BACKHAUL_HOSTILE_SEED`.
/// The daemon must never exit, `/healthz` must keep answering, and every task must end in a
/// defined state: completed byte-exact, failed with a code, or still retrying with a last error;
/// none may outlive its resource timeout.
@Suite("Hostile peers")
struct HostilePeerTests {
    static let seconds = Double(ProcessInfo.processInfo.environment["BACKHAUL_HOSTILE_SECONDS"] ?? "") ?? 40
    static let seed = UInt64(ProcessInfo.processInfo.environment["BACKHAUL_HOSTILE_SEED"] ?? "") ?? 49
    /// Seconds from creation before a task fails `timed_out`: an endless body (a byte a second,
    /// which no idle timeout catches) and the retries of one task end within it.
    static let resourceTimeout = 20.0

    @Test("hostile peers: mutated answers in every protocol; the daemon stays up, /healthz answers, every task ends defined")
    func hostilePeers() throws {
        let run = try HostileRun()
        let health = HealthProbe(url: run.fixture.daemon.url + "/healthz")
        let started = Date()
        var wave = 0
        while Date().timeIntervalSince(started) < Self.seconds, run.fixture.daemon.isRunning {
            try run.enqueueWave(wave)
            wave += 1
            Thread.sleep(forTimeInterval: 2)
        }
        // Every task ends by its resource timeout; a little more for the last wave's to be written.
        let settled = eventually(timeout: Self.resourceTimeout + 20, interval: 0.5) { run.unsettled().isEmpty }
        let (probes, misses) = health.stop()
        let answers = run.proxies.values.flatMap(\.answers)
        let mutated = answers.filter { $0["mutation"]?.stringValue != nil }
        print(
            "hostile peers: \(run.tasks.count) tasks in \(wave) waves, \(answers.count) answers, \(mutated.count) mutated, "
                + "/healthz \(probes) probes, \(misses) missed; "
                + run.outcomes().map { "\($0.key) \($0.value)" }.sorted().joined(separator: ", "))

        run.fixture.expectLog(run.fixture.daemon.isRunning, "the daemon exited: \(run.fixture.daemon.exitStatus ?? -1)")
        #expect(misses == 0 && probes > 0, "/healthz missed \(misses) of \(probes)")
        #expect(mutated.count > run.tasks.count / 2, "the proxies lied \(mutated.count) times")
        #expect(settled, "tasks still running past their resource timeout: \(run.unsettled().prefix(8))")
        for problem in run.problems() { Issue.record(Comment(rawValue: problem)) }
        // The peers behaved often enough for every protocol to finish some of its tasks.
        let completed = run.completedKinds()
        for kind in SoakTask.Kind.allCases {
            #expect(completed.contains(kind), "no \(kind.rawValue) task completed")
        }
        #expect(run.fixture.daemon.terminate() == 0, "SIGTERM at the end")
    }
}

/// `/healthz` asked every 200 ms on a thread of its own, with a 2 s timeout each.
final class HealthProbe: @unchecked Sendable {
    private let lock = NSLock()
    private var probes = 0
    private var misses = 0
    private var running = true
    private let url: String

    init(url: String) {
        self.url = url
        Thread { [self] in loop() }.start()
    }

    private func loop() {
        guard let client = try? HTTPClient() else { return }
        while true {
            let status = (try? client.send("GET", url, timeoutSeconds: 2).status) ?? 0
            lock.lock()
            let goOn = running
            if goOn {
                probes += 1
                if status != 200 { misses += 1 }
            }
            lock.unlock()
            guard goOn else { return }
            Thread.sleep(forTimeInterval: 0.2)
        }
    }

    /// Stops the probes; how many were made and how many went unanswered.
    func stop() -> (probes: Int, misses: Int) {
        lock.lock()
        defer { lock.unlock() }
        running = false
        return (probes, misses)
    }
}

/// The peers, their hostile proxies, the daemon and the tasks of one run.
final class HostileRun {
    let fixture: Fixture
    let tus: TusServer
    let s3: S3Server
    let ietf: IETFServer
    let downloads: DownloadServer
    let proxies: [SoakTask.Kind: HostileProxy]
    var pool: [(name: String, path: String, digest: [UInt8])] = []
    var tasks: [SoakTask] = []

    init() throws {
        fixture = try Fixture(sink: .resumable)
        let scratch = fixture.scratch.path
        tus = try TusServer(directory: scratch)
        s3 = try S3Server(directory: scratch)
        let ietfPort = try freePort()
        downloads = try DownloadServer(directory: scratch)
        func proxy(_ kind: SoakTask.Kind, _ target: UInt16) throws -> HostileProxy {
            try HostileProxy(
                target: target, directory: scratch, name: kind.rawValue, seed: HostilePeerTests.seed &+ UInt64(target),
                rate: 0.3, stall: HostilePeerTests.resourceTimeout * 2)
        }
        var proxies: [SoakTask.Kind: HostileProxy] = [:]
        for kind in [SoakTask.Kind.raw, .multipart, .chunked] { proxies[kind] = try proxy(kind, fixture.sink.port) }
        proxies[.tus] = try proxy(.tus, tus.peer.port)
        proxies[.s3] = try proxy(.s3, s3.peer.port)
        proxies[.ietf] = try proxy(.ietf, ietfPort)
        proxies[.download] = try proxy(.download, downloads.peer.port)
        self.proxies = proxies
        // The IETF peer names the proxy in the upload resources it hands out.
        ietf = try IETFServer(directory: scratch, port: ietfPort, origin: "http://127.0.0.1:\(proxies[.ietf]!.port)")
        for (index, size) in [3 << 10, 40 << 10, 200 << 10, 700 << 10, 6 << 20].enumerated() {
            let path = fixture.makeFile("h\(index).bin", size: size)
            try FileManager.default.copyItem(atPath: path, toPath: downloads.root + "/h\(index).bin")
            pool.append(("h\(index).bin", path, SHA256Hasher.digest(Array(fixture.contents(path)))))
        }
        try FileManager.default.createDirectory(atPath: fixture.data + "/dl", withIntermediateDirectories: true)
        try fixture.session(
            "s1",
            [
                "retry": ["max_attempts": 6, "initial_backoff": 0.1, "max_backoff": 0.5],
                "timeout_interval_for_request": 2, "timeout_interval_for_resource": .double(HostilePeerTests.resourceTimeout),
            ])
    }

    /// One task per protocol and a download, through the proxies; sizes rotate through the pool
    /// (S3's 6 MiB file goes as a multipart upload).
    func enqueueWave(_ wave: Int) throws {
        for (index, kind) in SoakTask.Kind.allCases.enumerated() {
            let file = pool[(wave + index) % (kind == .s3 ? 5 : 4)]
            let tag = "w\(wave)-\(kind.rawValue)"
            let proxy = proxies[kind]!
            var object: JSONObject = ["file": .string(file.path)]
            switch kind {
            case .raw:
                object["request"] = ["url": .string(proxy.url("/raw/\(tag)")), "method": "PUT"]
            case .multipart:
                object["request"] = ["url": .string(proxy.url("/form/\(tag)")), "method": "POST"]
                object["upload"] = ["protocol": "multipart", "field": "file", "filename": .string("\(tag).bin")]
            case .chunked:
                object["request"] = ["url": .string(proxy.url("/chunked/\(tag)")), "method": "PUT"]
                object["upload"] = ["protocol": "chunked", "chunk_size": 65_536]
            case .tus:
                object["request"] = ["url": .string(proxy.url("/files")), "method": "POST"]
                object["upload"] = ["protocol": "tus", "chunk_size": 65_536, "filename": .string("\(tag).bin")]
            case .s3:
                object["request"] = ["url": .string(proxy.url("/\(s3.bucket)/hostile/\(tag).bin")), "method": "PUT"]
                object["upload"] = ["protocol": "s3", "chunk_size": .int(5 << 20)]
                object["s3"] = s3.taskCredentials
            case .ietf:
                object["request"] = ["url": .string(proxy.url("/up/\(tag).bin")), "method": "POST"]
                object["upload"] = ["protocol": "ietf"]
            case .download:
                object = [
                    "kind": "download", "request": ["url": .string(proxy.url("/\(file.name)"))],
                    "destination": .string("\(fixture.data)/dl/\(tag).bin"),
                    "expected_sha256": .string(SHA256Hasher.hex(file.digest)),
                ]
            }
            let (status, body) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", .object(object))
            try #require(status == 201, "enqueue \(tag): \(status) \(body.serialized())")
            tasks.append(
                SoakTask(tag: tag, id: body["id"]?.stringValue ?? "", kind: kind, poolFile: file.name, enqueuedAt: 0))
        }
    }

    /// Every task as the daemon shows it now.
    func shown() -> [(SoakTask, JSON)] {
        tasks.map { ($0, (try? fixture.daemon.task($0.id)) ?? .null) }
    }

    /// Tasks neither finished nor waiting with a last error (the defined states).
    func unsettled() -> [String] {
        shown().compactMap { task, json in
            let state = json["state"]?.stringValue ?? "?"
            if ["completed", "failed"].contains(state) { return nil }
            return "\(task.tag) \(state)"
        }
    }

    func outcomes() -> [String: Int] {
        var counts: [String: Int] = [:]
        for (task, json) in shown() {
            counts["\(task.kind.rawValue) \(json["state"]?.stringValue ?? "?")", default: 0] += 1
        }
        return counts
    }

    func completedKinds() -> Set<SoakTask.Kind> {
        Set(shown().filter { $0.1["state"]?.stringValue == "completed" }.map(\.0.kind))
    }

    /// What breaks the rules: a completed task whose peer does not hold its bytes, a failed one
    /// without an error code, a waiting one without a last error, a task that ended past its
    /// resource timeout.
    func problems() -> [String] {
        let requests = Dictionary(grouping: fixture.sink.requests, by: \.path)
        let tusUploads = tus.uploadsByFilename
        var problems: [String] = []
        for (task, json) in shown() {
            let state = json["state"]?.stringValue ?? "?"
            let created = json["created_at"]?.stringValue.flatMap(RFC3339.parse) ?? 0
            if let finished = json["finished_at"]?.stringValue.flatMap(RFC3339.parse),
                finished - created > HostilePeerTests.resourceTimeout + 5
            {
                problems.append("\(task.tag): ended \(Int(finished - created)) s after its creation")
            }
            switch state {
            case "completed":
                let expected = pool.first { $0.name == task.poolFile }?.digest ?? []
                if !received(task, requests, tusUploads).contains(where: { SHA256Hasher.digest(Array($0)) == expected }) {
                    problems.append("\(task.tag): completed, but the peer does not hold its \(task.poolFile)")
                }
            case "failed":
                if json["error"]?["code"]?.intValue == nil || json["error"]?["name"]?.stringValue == nil {
                    problems.append("\(task.tag): failed without an error code: \(json.serialized())")
                }
            default:
                if json["last_error"] == nil || json["last_error"] == .null {
                    problems.append("\(task.tag): \(state) without a last error: \(json.serialized())")
                }
            }
        }
        return problems
    }

    /// What the real peer holds for a task.
    func received(_ task: SoakTask, _ requests: [String: [RecordingSink.Recorded]], _ tusUploads: [String: [String]]) -> [Data] {
        switch task.kind {
        case .raw:
            return (requests["/raw/\(task.tag)"] ?? []).filter { $0.answered && $0.status == 201 }.map(\.body)
        case .multipart:
            return (requests["/form/\(task.tag)"] ?? []).filter { $0.answered && $0.status == 201 }.flatMap { request in
                let boundary = request.headers["content-type"]?.components(separatedBy: "boundary=").last ?? ""
                return Multipart.parse(request.body, boundary: boundary).filter { $0.name == "file" }.map(\.body)
            }
        case .chunked: return [fixture.sink.assembled("/chunked/\(task.tag)")]
        case .tus: return (tusUploads["\(task.tag).bin"] ?? []).map { fixture.contents($0) }
        case .s3: return [s3.object("hostile/\(task.tag).bin")]
        case .ietf: return ietf.uploads.filter { $0.contains("\(task.tag).bin") }.map { fixture.contents($0) }
        case .download: return [fixture.contents("\(fixture.data)/dl/\(task.tag).bin")]
        }
    }
}
