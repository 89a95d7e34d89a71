import BackhaulTesting
import Digest
import Foundation
import Glibc
import JSONCodec
import Testing

/// Fault injection (issue: "every byte arrives, nothing is lost"). The short form runs with the
/// other tests; `make torture` sets `BACKHAUL_TORTURE=full` for the long form (50 uploads, 10
/// SIGKILLs, 60 flaky-server uploads).
enum TortureScale {
    static let full = ProcessInfo.processInfo.environment["BACKHAUL_TORTURE"] == "full"
    static var uploads: Int { full ? 50 : 16 }
    static var kills: Int { full ? 10 : 4 }
    static var flakyUploads: Int { full ? 60 : 20 }
}

extension EndToEndTests {
    struct Planned {
        var id: String
        var protocolName: String
        var file: String
        var size: Int
        var chunk: Int
        var target: String
    }

    @Test(
        "crash loop: mixed protocols against throttled servers, SIGKILLed at random and restarted; every byte arrives once per webhook-id"
    )
    func crashLoop() throws {
        let fixture = try Fixture(
            daemonArguments: fastWebhookRetries, sink: .throttle(bytesPerSecond: 3_000_000, then: .resumable))
        let tus = try TusServer(directory: fixture.scratch.path)
        let s3 = try S3Server(directory: fixture.scratch.path)
        let secret = WebhookRecordSecret.fixed
        let receiver = try WebhookReceiver(directory: fixture.scratch.path, secrets: [secret])
        try fixture.session("s1", ["retry": ["initial_backoff": 0.2, "max_backoff": 2], "max_connections_per_host": 8])
        _ = try fixture.subscribe(receiver.url, secret: secret, events: ["task.completed", "task.failed", "task.cancelled"])
        var random = SystemRandomNumberGenerator()
        var planned: [Planned] = []
        let protocols = ["raw", "chunked", "tus", "s3"]
        for index in 0..<TortureScale.uploads {
            let kind = protocols[index % protocols.count]
            let size =
                kind == "s3"
                ? Int.random(in: 6_000_000...14_000_000, using: &random) : Int.random(in: 50_000...6_000_000, using: &random)
            let file = fixture.makeFile("t\(index).bin", size: size)
            let chunk = kind == "s3" ? 5 << 20 : 1 << 20
            var extra: JSONObject = ["upload": ["protocol": .string(kind), "chunk_size": .int(Int64(chunk))]]
            var target = "/t\(index)"
            switch kind {
            case "tus": extra["request"] = ["url": .string(tus.creationURL), "method": "POST"]
            case "s3":
                target = "crash/t\(index).bin"
                extra["request"] = ["url": .string(s3.objectURL(target)), "method": "PUT"]
                extra["s3"] = s3.taskCredentials
            default: break
            }
            let id = try fixture.enqueue(file, path: target, extra: extra)
            planned.append(Planned(id: id, protocolName: kind, file: file, size: size, chunk: chunk, target: target))
        }
        var crashes = 0
        for _ in 0..<TortureScale.kills {
            Thread.sleep(forTimeInterval: Double.random(in: 0.3...1.2, using: &random))
            fixture.daemon.kill9()
            crashes += 1
            try fixture.daemon.start()
        }
        for task in planned {
            let final = try fixture.daemon.waitForTask(task.id, timeout: 240)
            fixture.expectLog(
                final["state"]?.stringValue == "completed", "\(task.protocolName) \(task.id): \(final.serialized())")
        }
        // Exact bytes, each protocol checked at its server.
        let tusUploads = Set(tus.uploads.map { SHA256Hasher.digest(Array(fixture.contents($0))) })
        var resent: [String: Int64] = [:]
        for task in planned {
            let expected = fixture.contents(task.file)
            switch task.protocolName {
            case "raw":
                let bodies = fixture.sink.requests.filter { $0.path == task.target }
                #expect(Bytes(bodies.last(where: { $0.answered })?.body) == Bytes(expected), "raw \(task.id)")
            case "chunked":
                #expect(Bytes(fixture.sink.assembled(task.target)) == Bytes(expected), "chunked \(task.id)")
                let sent = fixture.sink.requests.filter { $0.path == task.target }.reduce(Int64(0)) { $0 + $1.bodyLength }
                resent["chunked", default: 0] += sent - Int64(task.size)
                #expect(
                    sent - Int64(task.size) <= Int64(task.chunk * (crashes + 1)),
                    "chunked \(task.id) re-sent \(sent - Int64(task.size))")
            case "tus":
                #expect(tusUploads.contains(SHA256Hasher.digest(Array(expected))), "tus \(task.id)")
            default:
                #expect(Bytes(s3.object(task.target)) == Bytes(expected), "s3 \(task.id)")
            }
        }
        // One webhook-id per task's final event, however often it was delivered.
        let all = eventually(timeout: 60) {
            Set(receiver.accepted.compactMap { $0["task_id"]?.stringValue }).isSuperset(of: planned.map(\.id))
        }
        fixture.expectLog(all, "webhooks accepted: \(receiver.accepted.count)")
        var idsByTask: [String: Set<String>] = [:]
        for delivery in receiver.accepted {
            idsByTask[delivery["task_id"]?.stringValue ?? "", default: []].insert(delivery["webhook_id"]?.stringValue ?? "")
        }
        for task in planned {
            #expect(idsByTask[task.id]?.count == 1, "task \(task.id) has \(idsByTask[task.id]?.count ?? 0) webhook-ids")
        }
        print(
            "torture crash loop: \(planned.count) uploads, \(crashes) SIGKILLs survived, lost 0, chunked re-sent \(resent["chunked"] ?? 0) bytes, "
                + "\(receiver.accepted.count) webhook deliveries accepted for \(planned.count) final events")
    }

    @Test("flaky server: 30% of requests fail at random (5xx, 429, drops, stalls, no answer); every task completes in time")
    func flakyServer() throws {
        let fixture = try Fixture(
            sink: .flaky(
                rate: 0.3, seed: UInt64.random(in: 1...UInt64.max), stall: 2.5,
                then: .throttle(bytesPerSecond: 20_000_000, then: .resumable)))
        try fixture.session(
            "s1",
            [
                "retry": ["initial_backoff": 0.1, "max_backoff": 1], "timeout_interval_for_request": 1,
                "timeout_interval_for_resource": 120,
            ])
        var planned: [Planned] = []
        for index in 0..<TortureScale.flakyUploads {
            let kind = index % 2 == 0 ? "raw" : "chunked"
            let size = Int.random(in: 10_000...3_000_000)
            let file = fixture.makeFile("f\(index).bin", size: size)
            let id = try fixture.enqueue(
                file, path: "/f\(index)", extra: ["upload": ["protocol": .string(kind), "chunk_size": 524_288]])
            planned.append(Planned(id: id, protocolName: kind, file: file, size: size, chunk: 524_288, target: "/f\(index)"))
        }
        let started = Date()
        for task in planned {
            let final = try fixture.daemon.waitForTask(task.id, timeout: 150)
            fixture.expectLog(
                final["state"]?.stringValue == "completed", "\(task.protocolName) \(task.id): \(final.serialized())")
            let expected = fixture.contents(task.file)
            if task.protocolName == "raw" {
                #expect(
                    Bytes(fixture.sink.requests.last(where: { $0.path == task.target && $0.status == 201 })?.body)
                        == Bytes(expected))
            } else {
                #expect(Bytes(fixture.sink.assembled(task.target)) == Bytes(expected))
            }
        }
        let faults = fixture.sink.faults
        print(
            "torture flaky server: \(planned.count) uploads completed in \(String(format: "%.1f", Date().timeIntervalSince(started))) s, "
                + "\(fixture.sink.requests.count) requests, faults injected \(faults.values.reduce(0, +)) \(faults.sorted { $0.key < $1.key })"
        )
        #expect(faults.values.reduce(0, +) > 0)
    }

    @Test("SIGTERM mid-transfer exits 0 in its bound; a SIGKILL during writes leaves a database that passes integrity_check")
    func signalsAndRecovery() throws {
        let fixture = try Fixture(
            daemonArguments: ["--shutdown-grace", "2"], sink: .throttle(bytesPerSecond: 2_000_000, then: .resumable))
        try fixture.session()
        let size = 24 * 1024 * 1024
        let file = fixture.makeFile("big.bin", size: size)
        let id = try fixture.enqueue(file, path: "/big", extra: ["upload": ["protocol": "chunked", "chunk_size": 1_048_576]])
        // Many small tasks keep the database busy with writes while the SIGKILL lands.
        for index in 0..<200 { _ = try fixture.enqueue(fixture.makeFile("s\(index)", size: 100), path: "/s\(index)") }
        try #require(eventually(timeout: 20) { fixture.sink.totalBodyBytes > 4_000_000 })
        let stopping = Date()
        let code = fixture.daemon.terminate()
        let took = Date().timeIntervalSince(stopping)
        #expect(code == 0 && took < 4, "SIGTERM: exit \(String(describing: code)) after \(took) s")
        let sentBefore = fixture.sink.requests.filter { $0.path == "/big" }.reduce(Int64(0)) { $0 + $1.bodyLength }
        try fixture.daemon.start()
        Thread.sleep(forTimeInterval: 0.3)
        fixture.daemon.kill9()
        let check = Process()
        check.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        check.arguments = [
            "python3", "-c",
            "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('PRAGMA integrity_check').fetchone()[0])",
            fixture.daemon.stateDirectory + "/backhaul.db",
        ]
        let output = Pipe()
        check.standardOutput = output
        try check.run()
        let verdict = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).trimmingCharacters(
            in: .whitespacesAndNewlines)
        check.waitUntilExit()
        #expect(verdict == "ok", "integrity_check after SIGKILL: \(verdict)")
        try fixture.daemon.start()
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        #expect(task["state"]?.stringValue == "completed")
        #expect(Bytes(fixture.sink.assembled("/big")) == Bytes(fixture.contents(file)))
        let sent = fixture.sink.requests.filter { $0.path == "/big" }.reduce(Int64(0)) { $0 + $1.bodyLength }
        #expect(
            sent - Int64(size) <= 2 * 1_048_576,
            "re-sent \(sent - Int64(size)) bytes after SIGTERM and SIGKILL (sent \(sentBefore) before the stop)")
        print(
            "torture signals: SIGTERM exit \(String(describing: code)) in \(String(format: "%.2f", took)) s; integrity_check \(verdict); re-sent \(sent - Int64(size)) bytes"
        )
    }
}

/// Whether this machine lets the tests mount a small tmpfs (root in a VM or a privileged container).
let canMountTmpfs: Bool = {
    let directory = NSTemporaryDirectory() + "backhaul-tmpfs-probe-\(getpid())"
    try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    guard mount("tmpfs", directory, "tmpfs", 0, "size=64k") == 0 else { return false }
    umount(directory)
    return true
}()

extension EndToEndTests {
    @Test(
        "full disk: the state directory on a tiny tmpfs fills up; the API answers 507, nothing accepted is lost, all of it runs once space returns",
        .enabled(if: canMountTmpfs, "needs permission to mount a tmpfs"))
    func fullDisk() throws {
        let scratch = TemporaryDirectory("backhaul-e2e")
        let volume = scratch.file("volume")
        try FileManager.default.createDirectory(atPath: volume, withIntermediateDirectories: true)
        try #require(mount("tmpfs", volume, "tmpfs", 0, "size=1536k") == 0)
        defer { umount2(volume, Int32(MNT_DETACH)) }
        try FileManager.default.createDirectory(atPath: scratch.file("data"), withIntermediateDirectories: true)
        let sink = try RecordingSink(directory: scratch.file("sink"))
        let daemon = try DaemonProcess(stateDirectory: volume + "/state", allowedRoot: scratch.file("data"))
        #expect(try daemon.call("PUT", "/v1/sessions/s1", ["configuration": [:]]).0 == 201)
        #expect(try daemon.call("PATCH", "/v1/sessions/s1", ["enabled": false]).0 == 200)
        let file = scratch.makeFile("data/a.bin", size: 1000)
        let padding = String(repeating: "x", count: 2000)
        var accepted: [String] = []
        var refused = 0
        for round in 0..<400 where refused < 3 {
            let batch: [JSON] = (0..<20).map { index in
                [
                    "file": .string(file), "request": ["url": .string(sink.url("/r\(round)-\(index)")), "method": "PUT"],
                    "description": .string(padding),
                ]
            }
            let (status, body) = try daemon.call("POST", "/v1/sessions/s1/tasks", ["tasks": .array(batch)])
            if status == 201 {
                accepted += body["tasks"]?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? []
            } else {
                #expect(status == 507 && body["code"]?.stringValue == "insufficient_storage", "\(status) \(body.serialized())")
                refused += 1
            }
        }
        #expect(refused >= 1, "the disk filled up (\(accepted.count) tasks accepted)")
        #expect(daemon.isRunning, "a full disk never crashes the daemon")
        #expect(try daemon.call("GET", "/v1/sessions/s1").0 == 200)
        // Space returns: everything accepted before runs, exactly once.
        try #require(mount("tmpfs", volume, "tmpfs", UInt(MS_REMOUNT), "size=256m") == 0)
        #expect(try daemon.call("PATCH", "/v1/sessions/s1", ["enabled": true]).0 == 200)
        for id in accepted {
            let task = try daemon.waitForTask(id, timeout: 60)
            #expect(task["state"]?.stringValue == "completed", "\(task.serialized())")
        }
        let paths = Set(sink.requests.filter { $0.status == 201 }.map(\.path))
        #expect(paths.count == accepted.count, "every accepted task reached the server")
        let code = daemon.terminate()
        #expect(code == 0)
        print(
            "torture full disk: \(accepted.count) tasks accepted before the disk filled, \(refused) batches refused 507, lost 0")
    }
}
