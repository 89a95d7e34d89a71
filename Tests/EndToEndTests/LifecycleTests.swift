import BackhaulTesting
import Foundation
import Glibc
import JSONCodec
import Testing

extension EndToEndTests {
    @Test("SIGKILL mid-upload, restart: the task runs again and arrives exact; nothing finished runs twice")
    func sigkillMidUpload() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 2_000_000, then: .respond(status: 201)))
        try fixture.session()
        let done = try fixture.enqueue(fixture.makeFile("done.bin", size: 1000), path: "/done")
        try fixture.daemon.waitForTask(done, state: "completed")
        let file = fixture.makeFile("big.bin", size: 6_000_000)
        let id = try fixture.enqueue(file, path: "/big")
        try #require(eventually(timeout: 10) { (fixture.sink.requests.last?.bodyLength ?? 0) > 1_000_000 })
        fixture.daemon.kill9()
        fixture.sink.setFallback(.respond(status: 201))
        try fixture.daemon.start()
        let task = try fixture.daemon.waitForTask(id, timeout: 30)
        fixture.expectLog(task["state"]?.stringValue == "completed", "after restart: \(task.serialized())")
        #expect(task["attempts"]?.intValue == 2)
        let bigRequests = fixture.sink.requests.filter { $0.path == "/big" }
        #expect(bigRequests.count == 2)
        #expect(Bytes(bigRequests.last?.body) == Bytes(fixture.contents(file)))
        #expect(fixture.sink.requests.filter { $0.path == "/done" }.count == 1)
        #expect(try fixture.daemon.task(done)["state"]?.stringValue == "completed")
    }

    @Test("SIGTERM during a transfer exits 0 within the grace period and the task resumes after restart")
    func sigtermDuringTransfer() throws {
        let fixture = try Fixture(
            daemonArguments: ["--shutdown-grace", "1"],
            sink: .throttle(bytesPerSecond: 500_000, then: .respond(status: 201)))
        try fixture.session()
        let file = fixture.makeFile("big.bin", size: 4_000_000)
        let id = try fixture.enqueue(file)
        try fixture.daemon.waitForTask(id, state: "running")
        let started = Date()
        let status = fixture.daemon.terminate(timeout: 10)
        #expect(status == 0)
        #expect(Date().timeIntervalSince(started) < 5)
        fixture.sink.setFallback(.respond(status: 201))
        try fixture.daemon.start()
        let task = try fixture.daemon.waitForTask(id)
        #expect(task["state"]?.stringValue == "completed")
        // The interrupted attempt was not counted against the task.
        #expect(task["attempts"]?.intValue == 1)
        #expect(Bytes(fixture.sink.requests.last?.body) == Bytes(fixture.contents(file)))
    }

    @Test("a daemon that does not stop after SIGTERM: terminate answers nil once its time is up, and the daemon is gone")
    func terminateOfAHungDaemon() throws {
        let fixture = try Fixture()
        let pid = fixture.daemon.pid
        kill(pid, SIGSTOP)  // a stop that hangs: SIGTERM stays pending while the process is stopped
        #expect(fixture.daemon.terminate(timeout: 1) == nil)
        #expect(!fixture.daemon.isRunning && kill(pid, 0) != 0, "the harness killed it after its report")
    }

    @Test("the daemon's own threads carry their names (for top -H, ps -L and profilers)")
    func threadNames() throws {
        let fixture = try Fixture()
        let tasks = "/proc/\(fixture.daemon.pid)/task"
        let names = Set(
            try FileManager.default.contentsOfDirectory(atPath: tasks).compactMap { thread in
                try? String(contentsOfFile: "\(tasks)/\(thread)/comm", encoding: .utf8)
                    .trimmingCharacters(in: .whitespacesAndNewlines)
            })
        for name in ["bh-curl", "bh-writer", "bh-settler", "bh-verifier", "bh-housekeeper"] {
            #expect(names.contains(name), "threads: \(names.sorted())")
        }
    }

    @Test("a second daemon on the same state directory is refused")
    func stateDirectoryLock() throws {
        let fixture = try Fixture()
        #expect(throws: (any Error).self) {
            _ = try DaemonProcess(stateDirectory: fixture.daemon.stateDirectory, allowedRoot: fixture.data)
        }
        #expect(fixture.daemon.isRunning)
    }

    @Test("DELETE mode=finish lets tasks finish and refuses new ones; mode=cancel cancels with reason 0")
    func sessionDeletion() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 1_000_000, then: .respond(status: 201)))
        try fixture.session("finishing")
        let file = fixture.makeFile("a.bin", size: 1_500_000)
        let id = try fixture.enqueue(file, session: "finishing")
        let (status, body) = try fixture.daemon.call("DELETE", "/v1/sessions/finishing?mode=finish")
        #expect(status == 202)
        #expect(body["state"]?.stringValue == "finishing")
        let (refused, problem) = try fixture.daemon.call(
            "POST", "/v1/sessions/finishing/tasks",
            ["file": .string(file), "request": ["url": .string(fixture.sink.url("/x"))]])
        #expect(refused == 409)
        #expect(problem["code"]?.stringValue == "conflict")
        #expect(eventually(timeout: 20) { (try? fixture.daemon.call("GET", "/v1/sessions/finishing").0) == 404 })
        #expect(Bytes(fixture.sink.requests.first?.body) == Bytes(fixture.contents(file)))
        _ = id

        try fixture.session("cancelling")
        let running = try fixture.enqueue(file, session: "cancelling")
        try fixture.daemon.waitForTask(running, state: "running")
        let queued = try fixture.enqueue(file, session: "cancelling", extra: ["earliest_begin_at": "2099-01-01T00:00:00Z"])
        #expect(try fixture.daemon.call("DELETE", "/v1/sessions/cancelling?mode=cancel").0 == 204)
        #expect(try fixture.daemon.call("GET", "/v1/sessions/cancelling").0 == 404)
        #expect(try fixture.daemon.call("GET", "/v1/tasks/\(queued)").1["state"]?.stringValue == "cancelled")
        #expect(eventually(timeout: 5) { fixture.sink.requests.last?.endedAt != nil })
    }

    @Test("disabling a session holds its tasks; cancel_pending cancels them with reason 1")
    func sessionDisable() throws {
        let fixture = try Fixture()
        try fixture.session()
        let (status, session) = try fixture.daemon.call("PATCH", "/v1/sessions/s1", ["enabled": false])
        #expect(status == 200)
        #expect(session["enabled"]?.boolValue == false)
        let id = try fixture.enqueue(fixture.makeFile("a.bin", size: 1000))
        let held = try fixture.daemon.task(id)
        #expect(held["state"]?.stringValue == "waiting")
        #expect(held["waiting_reason"]?.stringValue == "session_disabled")
        Thread.sleep(forTimeInterval: 0.3)
        #expect(fixture.sink.requests.isEmpty)
        #expect(try fixture.daemon.call("PATCH", "/v1/sessions/s1", ["enabled": true]).0 == 200)
        #expect(try fixture.daemon.waitForTask(id)["state"]?.stringValue == "completed")

        let second = try fixture.enqueue(
            fixture.makeFile("b.bin", size: 1000), extra: ["earliest_begin_at": "2099-01-01T00:00:00Z"])
        #expect(try fixture.daemon.call("PATCH", "/v1/sessions/s1", ["enabled": false, "cancel_pending": true]).0 == 200)
        let cancelled = try fixture.daemon.task(second)
        #expect(cancelled["state"]?.stringValue == "cancelled")
        #expect(cancelled["cancellation"]?["reason_code"]?.intValue == 1)
        #expect(cancelled["cancellation"]?["reason"]?.stringValue == "background_updates_disabled")
    }

    @Test("a request body over the limit is refused with 413 payload_too_large")
    func bodyLimit() throws {
        let fixture = try Fixture(daemonArguments: ["--max-body-bytes", "4096"])
        try fixture.session()
        let big = JSON.object(["file": .string(String(repeating: "a", count: 10_000))])
        let (status, body) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", big)
        #expect(status == 413)
        #expect(body["code"]?.stringValue == "payload_too_large")
        // The daemon is still serving.
        #expect(try fixture.daemon.call("GET", "/healthz").0 == 200)
    }

    @Test("health, readiness and info")
    func operations() throws {
        let fixture = try Fixture()
        #expect(try fixture.daemon.call("GET", "/healthz").0 == 200)
        #expect(try fixture.daemon.call("GET", "/readyz").0 == 200)
        let (status, info) = try fixture.daemon.call("GET", "/v1/info")
        #expect(status == 200)
        #expect(info["version"]?.stringValue != nil)
        #expect(info["allowed_roots"]?.arrayValue == [.string(fixture.data)])
    }
}

extension EndToEndTests {
    @Test("a running task shows live progress: bytes, rate and ETA")
    func liveProgress() throws {
        // Larger than the loopback socket buffers, which absorb a few MB at once.
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 2_000_000, then: .respond(status: 201)))
        try fixture.session()
        let id = try fixture.enqueue(fixture.makeFile("slow.bin", size: 24_000_000))
        var sample: JSON = .null
        let settled = eventually(timeout: 10) {
            sample = (try? fixture.daemon.task(id)) ?? .null
            let progress = sample["progress"]
            let rate = Double(progress?["bytes_per_second"]?.intValue ?? 0)
            let fraction = progress?["fraction"]?.doubleValue ?? 0
            return sample["state"]?.stringValue == "running" && fraction > 0.2 && fraction < 1 && rate > 600_000
                && rate < 6_000_000 && (progress?["eta_seconds"]?.doubleValue ?? 0) > 0
        }
        fixture.expectLog(settled, "no settled live progress: \(sample.serialized())")
        #expect(sample["progress"]?["bytes_total"]?.intValue == 24_000_000)
        _ = try fixture.daemon.call("POST", "/v1/tasks/\(id)/cancel")
    }
}
