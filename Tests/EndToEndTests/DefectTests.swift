import BackhaulCore
import BackhaulTesting
import Curl
import Digest
import Foundation
import Glibc
import JSONCodec
import Testing
import Threads

/// Defects found by review and by a new user's tries (issue 15): each test failed before its fix.
extension EndToEndTests {
    /// 15.2: a session PATCH valid for the session but invalid merged with a task's own overrides
    /// (max_backoff below the task's initial_backoff) made the engine drop the task's overrides
    /// silently, allows_cellular_access: false among them: the task uploaded over cellular.
    @Test("a session PATCH that a task's overrides cannot merge with is refused, naming the task; the task keeps waiting")
    func sessionPatchKeepsTaskOverrides() throws {
        let fixture = try Fixture()
        try fixture.session("s1", ["retry": ["initial_backoff": 5, "max_backoff": 60]])
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "cellular"]).0 == 200)
        let id = try fixture.enqueue(
            fixture.makeFile("a.bin", size: 10_000),
            extra: [
                "configuration": ["allows_cellular_access": false, "retry": ["initial_backoff": 40]]
            ])
        _ = try waitFor(fixture, id, "waiting", "cellular_not_allowed")
        let (status, problem) = try fixture.daemon.call(
            "PATCH", "/v1/sessions/s1", ["configuration": ["retry": ["max_backoff": 20]]])
        #expect(status == 422 && problem["code"]?.stringValue == "validation_failed", "\(problem.serialized())")
        #expect(problem["detail"]?.stringValue?.contains(id) == true, "the problem names the task: \(problem.serialized())")
        #expect(try fixture.daemon.call("GET", "/v1/sessions/s1").1["configuration"]?["retry"]?["max_backoff"]?.doubleValue == 60)
        Thread.sleep(forTimeInterval: 1.5)
        #expect(try state(fixture, id) == ("waiting", "cellular_not_allowed"))
        #expect(fixture.sink.requests.isEmpty, "nothing went out over cellular")
        // A change every task can take still goes through.
        #expect(try fixture.daemon.call("PATCH", "/v1/sessions/s1", ["configuration": ["retry": ["max_backoff": 50]]]).0 == 200)
    }

    /// 15.4: the `--max-open-tasks` check read the session's counts outside the write transaction,
    /// so concurrent POSTs could all pass it.
    @Test("48 concurrent POSTs cannot pass --max-open-tasks together")
    func concurrentCreatesHoldTheLimit() throws {
        let fixture = try Fixture(daemonArguments: ["--max-open-tasks", "10"])
        try fixture.session()
        #expect(try fixture.daemon.call("PATCH", "/v1/sessions/s1", ["enabled": false]).0 == 200)
        let file = fixture.makeFile("a.bin", size: 1000)
        let url = fixture.daemon.url + "/v1/sessions/s1/tasks"
        let body = JSON.object(["file": .string(file), "request": ["url": .string(fixture.sink.url("/x"))]]).serializedBytes()
        let statuses = Locked<[Int]>([])
        concurrently(48) { _ in
            let status = (try? HTTPClient().send("POST", url, body: body).status) ?? -1
            statuses.withLock { $0.append(status) }
        }
        let answers = statuses.withLock { $0 }
        #expect(answers.filter { $0 == 201 }.count == 10, "\(answers.sorted())")
        #expect(answers.filter { $0 == 429 }.count == 38, "\(answers.sorted())")
        let counts = try fixture.daemon.call("GET", "/v1/sessions/s1").1["task_counts"]
        #expect(counts?["waiting"]?.intValue == 10, "\(counts?.serialized() ?? "")")
    }

    /// 15.4: PATCH merged the configuration read outside the write transaction: of two concurrent
    /// PATCHes changing different members, one was lost.
    @Test("24 concurrent session PATCHes, each adding a header: none is lost")
    func concurrentPatchesLoseNothing() throws {
        let fixture = try Fixture()
        try fixture.session()
        let url = fixture.daemon.url + "/v1/sessions/s1"
        let statuses = Locked<[Int]>([])
        concurrently(24) { index in
            let body = JSON.object(["configuration": ["default_headers": .object(["X-Client-\(index)": .string("\(index)")])]])
            let status = (try? HTTPClient().send("PATCH", url, body: body.serializedBytes()).status) ?? -1
            statuses.withLock { $0.append(status) }
        }
        #expect(statuses.withLock { $0 }.allSatisfy { $0 == 200 })
        let headers = try fixture.daemon.call("GET", "/v1/sessions/s1").1["configuration"]?["default_headers"]?.objectValue ?? [:]
        #expect(Set(headers.keys) == Set((0..<24).map { "X-Client-\($0)" }), "\(headers.keys.sorted())")
    }

    /// 15.7 (OpenAPI/backhaul.yaml): DELETE ?mode=cancel removed the tasks with the session, so a client
    /// polling a task got 404 and never learned it was cancelled, or why.
    @Test("DELETE a session with mode=cancel: its tasks stay readable as cancelled (reason 0); the session is gone")
    func cancelledSessionTasksStayReadable() throws {
        let fixture = try Fixture()
        try fixture.session("gone")
        let file = fixture.makeFile("a.bin", size: 1000)
        let later = try fixture.enqueue(
            file, session: "gone", extra: ["earliest_begin_at": "2099-01-01T00:00:00Z", "idempotency_key": "k1"])
        #expect(try fixture.daemon.call("DELETE", "/v1/sessions/gone?mode=cancel").0 == 204)
        #expect(try fixture.daemon.call("GET", "/v1/sessions/gone").0 == 404)
        let (status, task) = try fixture.daemon.call("GET", "/v1/tasks/\(later)")
        #expect(status == 200 && task["state"]?.stringValue == "cancelled", "\(task.serialized())")
        #expect(task["cancellation"]?["reason_code"]?.intValue == 0 && task["session_id"]?.stringValue == "gone")
        // A session made again under the same id starts empty: the old task is not its task, and
        // its idempotency key is free again.
        try fixture.session("gone")
        #expect(try fixture.daemon.call("GET", "/v1/sessions/gone/tasks").1["tasks"]?.arrayValue?.isEmpty == true)
        let again = try fixture.daemon.call(
            "POST", "/v1/sessions/gone/tasks",
            [
                "file": .string(file), "request": ["url": .string(fixture.sink.url("/x"))], "idempotency_key": "k1",
            ])
        #expect(again.0 == 201 && again.1["id"]?.stringValue != later)
    }
}

extension EndToEndTests {
    /// OpenAPI/backhaul.yaml: a task that cannot reach its server showed `retrying`, `attempts: 5`,
    /// `error: null` for days. Now `last_error` and the attempt history say why.
    @Test("failures a client sees before the end: last_error while retrying, and the attempt history")
    func failuresVisibleBeforeTheEnd() throws {
        let fixture = try Fixture()
        try fixture.session("s1", ["retry": ["initial_backoff": 0.3, "max_backoff": 0.3]])
        fixture.sink.enqueue(.respond(status: 503), .respond(status: 503))
        let file = fixture.makeFile("a.bin", size: 50_000)
        let id = try fixture.enqueue(file)
        let retrying = try fixture.daemon.waitForTask(id, state: "retrying")
        let lastError = try #require(retrying["last_error"]?.objectValue, "\(retrying.serialized())")
        #expect(lastError["code"]?.intValue == -1011 && lastError["http_status"]?.intValue == 503)
        #expect(lastError["name"]?.stringValue == "bad_server_response" && lastError["at"]?.stringValue != nil)
        #expect(retrying["error"] == .null)
        let done = try fixture.daemon.waitForTask(id)
        #expect(done["state"]?.stringValue == "completed")
        let (status, body) = try fixture.daemon.call("GET", "/v1/tasks/\(id)/attempts")
        let attempts = try #require(body["attempts"]?.arrayValue)
        #expect(status == 200 && attempts.count == 3, "\(body.serialized())")
        #expect(attempts.map { $0["outcome"]?.stringValue } == ["completed", "retry", "retry"])
        #expect(attempts.map { $0["number"]?.intValue } == [3, 2, 1])
        #expect(attempts[1]["http_status"]?.intValue == 503 && attempts[1]["error"]?["code"]?.intValue == -1011)
        #expect(attempts[0]["bytes_sent"]?.intValue == 50_000 && attempts[0]["network_type"]?.stringValue == "wired")
        #expect(attempts[0]["error"] == .null)
        #expect(try fixture.daemon.call("GET", "/v1/tasks/tsk_nonexistent/attempts").0 == 404)

        // Nobody listening: the transport error, named, while it retries.
        let port = try freePort()
        let refused = try fixture.enqueue(
            file, extra: ["request": ["url": .string("http://127.0.0.1:\(port)/x"), "method": "PUT"]])
        let waiting = try fixture.daemon.waitForTask(refused, state: "retrying")
        #expect(waiting["last_error"]?["code"]?.intValue == -1004, "\(waiting.serialized())")
        #expect(waiting["last_error"]?["name"]?.stringValue == "cannot_connect_to_host")
        #expect(try fixture.daemon.call("POST", "/v1/tasks/\(refused)/cancel").0 == 200)
    }

    /// Issue 15.3: a stored network override that cannot be read was dropped silently at start, so
    /// a box pinned to "cellular" by its modem manager went back to detection. Now the daemon
    /// refuses to start on it, saying what to do, with its own exit status.
    @Test("a stored network override that cannot be read refuses the start (exit 65) instead of being dropped")
    func corruptSettingRefusesStart() throws {
        let fixture = try Fixture()
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "cellular"]).0 == 200)
        #expect(fixture.daemon.terminate() == 0)
        let database = fixture.daemon.stateDirectory + "/backhaul.db"
        let edit = Process()
        edit.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        edit.arguments = [
            "python3", "-c",
            """
            import sqlite3, sys
            db = sqlite3.connect(sys.argv[1])
            db.execute("UPDATE settings SET value = '{\\"type\\": \\"5g\\"}' WHERE key = 'network_override'")
            db.commit()
            """, database,
        ]
        try edit.run()
        edit.waitUntilExit()
        #expect(throws: DaemonProcess.DaemonError.self) { try fixture.daemon.start() }
        #expect(fixture.daemon.exitStatus == 65)
        #expect(fixture.daemon.log(lastLines: 5).contains("network override"), "\(fixture.daemon.log(lastLines: 5))")
    }
}

extension EndToEndTests {
    /// Issue 15.6: a download's whole-file SHA-256 and fsync ran inside the engine's store batch,
    /// so every API read waited for them (about half a second per GiB). The API must answer while a
    /// download is being verified.
    @Test("the API answers while a big download is verified (the SHA-256 runs outside the store's batch)")
    func apiAnswersDuringVerification() throws {
        let fixture = try Fixture()
        let nginx = try NginxServer(directory: fixture.scratch.file("nginx"))
        let source = fixture.scratch.file("nginx/root/big.bin")
        _ = FileManager.default.createFile(atPath: source, contents: nil)
        #expect(truncate(source, 384 << 20) == 0)
        let digest = sha256sum(source)
        // What the daemon's own hashing costs here: the same library (OpenSSL) over the same bytes.
        let started = Date()
        let hasher = SHA256Hasher()
        let zeros = [UInt8](repeating: 0, count: 1 << 20)
        zeros.withUnsafeBytes { chunk in for _ in 0..<384 { hasher.update(chunk) } }
        #expect(SHA256Hasher.hex(hasher.finish()) == digest)
        let hashSeconds = Date().timeIntervalSince(started)
        try fixture.session()
        let id = try fixture.enqueueDownload(nginx.url("/big.bin"), to: "big.bin", extra: ["expected_sha256": .string(digest)])
        var slowest = 0.0
        var last = JSON.null
        let finished = eventually(timeout: 120, interval: 0.01) {
            let asked = Date()
            last = (try? fixture.daemon.task(id)) ?? .null
            slowest = max(slowest, Date().timeIntervalSince(asked))
            return ["completed", "failed", "cancelled"].contains(last["state"]?.stringValue ?? "")
        }
        fixture.expectLog(finished && last["state"]?.stringValue == "completed", last.serialized())
        #expect(
            slowest < max(0.05, hashSeconds / 2),
            "the slowest GET took \(slowest) s; hashing the file takes \(hashSeconds) s")
        print(
            "verification: slowest GET \(String(format: "%.3f", slowest)) s while a \(String(format: "%.2f", hashSeconds)) s hash ran"
        )
    }
}
