import BackhaulTesting
import Curl
import Foundation
import JSONCodec
import Testing

extension EndToEndTests {
    /// docs/operations.md, issue 36.6: rows whose stored protocol state no attempt can have written (a tus
    /// upload with acknowledged bytes but no URL, S3 parts without their UploadId, an IETF upload
    /// resource without its interop version), left `running` as by a crash, are met at the next
    /// start. Each of those tasks fails -3100 with a log line naming it; the daemon stays up and
    /// another task still uploads. A queued row this build cannot read at all (a checkpoint
    /// without its offset) at the head of the queue is set aside, not retried ahead of every
    /// other task.
    @Test("tasks whose stored protocol state is impossible fail -3100 after a restart; the daemon and other tasks go on")
    func impossibleStoredStates() throws {
        let fixture = try Fixture()
        try fixture.session("s1", quickRetry)
        let later: JSON = "2099-01-01T00:00:00Z"
        var ids: [String: String] = [:]
        let uploads: [(name: String, extra: JSONObject)] = [
            ("tus", ["upload": ["protocol": "tus", "chunk_size": 1000]]),
            (
                "s3",
                [
                    "upload": ["protocol": "s3"],
                    "s3": ["region": "us-east-1", "access_key_id": "AKIA", "secret_access_key": "x"],
                ]
            ),
            ("ietf", ["upload": ["protocol": "ietf"]]),
        ]
        for upload in uploads {
            var extra = upload.extra
            extra["earliest_begin_at"] = later
            ids[upload.name] = try fixture.enqueue(
                fixture.makeFile("\(upload.name).bin", size: 4096), path: "/\(upload.name)", extra: extra)
        }
        let unreadable = try fixture.enqueue(
            fixture.makeFile("unreadable.bin", size: 4096), path: "/unreadable", extra: ["earliest_begin_at": later])
        #expect(fixture.daemon.terminate() == 0)

        // As a crash mid-transfer leaves them: running, an attempt begun, the checkpoint broken.
        let checkpoints = [
            "tus": #"{"offset": 1000, "attempt": 1}"#,
            "s3": #"{"offset": 0, "attempt": 1, "parts": ["\"e1\""]}"#,
            "ietf": #"{"offset": 1000, "attempt": 1, "location": "\#(fixture.sink.url("/resumable/abc"))"}"#,
        ]
        var statements: [String] = []
        for (name, checkpoint) in checkpoints {
            let id = try #require(ids[name])
            statements.append(
                "UPDATE tasks SET state = 'running', waiting_reason = NULL, earliest_begin_at = NULL, attempts = 1, "
                    + "started_at = created_at, checkpoint = '\(checkpoint)' WHERE id = '\(id)'")
        }
        statements.append(
            "UPDATE tasks SET state = 'queued', waiting_reason = NULL, earliest_begin_at = NULL, priority = 1, "
                + "checkpoint = '{\"attempt\": 1}' WHERE id = '\(unreadable)'")
        try editState(fixture, statements)

        try fixture.daemon.start()
        let pid = fixture.daemon.pid
        for (name, id) in ids.sorted(by: { $0.key < $1.key }) {
            let task = try fixture.daemon.waitForTask(id)
            fixture.expectLog(task["state"]?.stringValue == "failed", "\(name): \(task.serialized())")
            #expect(task["error"]?["code"]?.intValue == -3100, "\(name): \(task.serialized())")
            #expect(task["error"]?["name"]?.stringValue == "internal_error", "\(name): \(task.serialized())")
            #expect(task["attempts"]?.intValue == 2, "\(name): one attempt more than the crashed one, no retry")
        }
        // Nothing of theirs reached the sink: each failed before its first request.
        #expect(fixture.sink.requests.isEmpty, "\(fixture.sink.requests.map(\.path))")

        // One error line per task, naming it.
        let lines = fixture.daemon.log(lastLines: 100_000).split(separator: "\n")
        for (name, id) in ids {
            let named = lines.filter { $0.contains("should be impossible") && $0.contains(id) }
            #expect(named.count == 1, "\(name): \(named)")
            #expect(named.first?.contains("\"level\":\"error\"") == true, "\(name): \(named)")
        }
        let setAside = lines.filter { $0.contains("set aside") && $0.contains(unreadable) }
        #expect(!setAside.isEmpty, "the unreadable task is named in the log")
        // And counted among the engine's faults.
        let client = try HTTPClient()
        var text = ""
        let counted = try eventually(timeout: 5) {
            let metrics = try client.send("GET", "http://127.0.0.1:\(fixture.daemon.port)/metrics")
            text = String(decoding: metrics.body, as: UTF8.self)
            return text.contains("backhaul_engine_faults_total{kind=\"internal_error\"} 3")
        }
        #expect(counted, "\(text.split(separator: "\n").filter { $0.contains("faults") })")

        // The same daemon goes on: another upload completes, byte-exact.
        let file = fixture.makeFile("normal.bin", size: 70_000)
        let normal = try fixture.enqueue(file, path: "/normal")
        let done = try fixture.daemon.waitForTask(normal)
        fixture.expectLog(done["state"]?.stringValue == "completed", "normal: \(done.serialized())")
        #expect(fixture.daemon.isRunning && fixture.daemon.pid == pid)
        let received = try #require(fixture.sink.requests.last)
        #expect(received.path == "/normal" && Bytes(received.body) == Bytes(fixture.contents(file)))
    }

    @Test("a running task whose stored checkpoint cannot be read at all fails -3100 at the start; the daemon starts")
    func unreadableRunningTask() throws {
        let fixture = try Fixture()
        try fixture.session("s1")
        let id = try fixture.enqueue(
            fixture.makeFile("a.bin", size: 4096), path: "/a", extra: ["earliest_begin_at": "2099-01-01T00:00:00Z"])
        #expect(fixture.daemon.terminate() == 0)
        try editState(
            fixture,
            [
                "UPDATE tasks SET state = 'running', waiting_reason = NULL, earliest_begin_at = NULL, attempts = 1, "
                    + "started_at = created_at, checkpoint = '{not json' WHERE id = '\(id)'"
            ])
        try fixture.daemon.start()
        let task = try fixture.daemon.waitForTask(id)
        fixture.expectLog(task["error"]?["code"]?.intValue == -3100, "\(task.serialized())")
        #expect(task["state"]?.stringValue == "failed")
        let lines = fixture.daemon.log(lastLines: 1000).split(separator: "\n")
        #expect(lines.contains { $0.contains("cannot be read") && $0.contains(id) }, "no log line names \(id)")
        // A second start meets no running row: it starts as any other.
        #expect(fixture.daemon.terminate() == 0)
        try fixture.daemon.start()
        #expect(try fixture.daemon.call("GET", "/readyz").0 == 200)
    }

    /// Runs SQL statements on the stopped daemon's state with Python's sqlite3 (each must change a row).
    private func editState(_ fixture: Fixture, _ statements: [String]) throws {
        let edit = Process()
        edit.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        edit.arguments =
            [
                "python3", "-c",
                """
                import sqlite3, sys
                db = sqlite3.connect(sys.argv[1])
                changed = 0
                for statement in sys.argv[2:]:
                    changed += db.execute(statement).rowcount
                db.commit()
                sys.exit(0 if changed == len(sys.argv) - 2 else 1)
                """, fixture.daemon.stateDirectory + "/backhaul.db",
            ] + statements
        try edit.run()
        edit.waitUntilExit()
        try #require(edit.terminationStatus == 0, "the state edit failed")
    }
}
