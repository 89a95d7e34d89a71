import BackhaulTesting
import Curl
import Foundation
import Glibc
import JSON
import Testing

/// A failed sync of the state is never answered as durable (docs/operations.md, "When the disk
/// fails"). A preload library of the tests' own (Tests/preload/syncfault.c) makes `fsync` and
/// `fdatasync` of the state's files fail once a trigger file exists: the daemon answers no write
/// from then on, `/readyz` turns 503, the log names the errno, a metric counts it, and the process
/// stops with exit 75; started again without the fault it holds every task acknowledged before.
extension EndToEndTests {
    @Test("a failed sync of the state fails closed, and a restart holds everything acknowledged", arguments: ["EIO", "ENOSPC"])
    func failedSyncFailsClosed(errno name: String) throws {
        let preload = try SyncFaultLibrary.path()
        let fixture = try Fixture()
        let trigger = fixture.scratch.file("fault-now")
        let faults = fixture.scratch.file("faults.log")
        fixture.daemon.environment = [
            "LD_PRELOAD": preload, "SYNCFAULT_TRIGGER": trigger, "SYNCFAULT_ERRNO": name,
            "SYNCFAULT_PATH": fixture.daemon.stateDirectory + "/backhaul.db", "SYNCFAULT_LOG": faults,
        ]
        _ = fixture.daemon.terminate()
        try fixture.daemon.start()
        try fixture.session("s1")
        // Disabled: the tasks wait, so the restart finds them as they were acknowledged.
        #expect(try fixture.daemon.call("PATCH", "/v1/sessions/s1", ["enabled": false]).0 == 200)
        let file = fixture.makeFile("a.bin", size: 1000)
        var acknowledged: [String] = []
        for index in 0..<5 { acknowledged.append(try fixture.enqueue(file, path: "/acked/\(index)")) }

        _ = FileManager.default.createFile(atPath: trigger, contents: nil)
        let task: JSON = ["file": .string(file), "request": ["url": .string(fixture.sink.url("/after")), "method": "PUT"]]
        let (status, body) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", task)
        let (expectedStatus, expectedCode) = name == "ENOSPC" ? (507, "insufficient_storage") : (503, "state_unavailable")
        fixture.expectLog(
            status == expectedStatus && body["code"]?.stringValue == expectedCode,
            "the POST after the fault: \(status) \(body.serialized())")
        let (ready, readyBody) = try fixture.daemon.call("GET", "/readyz")
        fixture.expectLog(
            ready == 503 && readyBody["code"]?.stringValue == "state_unavailable", "/readyz: \(ready) \(readyBody.serialized())")
        // No durable answer follows the failure, whether or not it needs a sync.
        let (again, _) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", task)
        #expect(again == expectedStatus)
        let (patched, _) = try fixture.daemon.call("PATCH", "/v1/sessions/s1", ["enabled": true])
        #expect(patched == expectedStatus)
        let metrics = try HTTPClient().send("GET", fixture.daemon.url + "/metrics")
        let text = String(decoding: metrics.body, as: UTF8.self)
        #expect(
            text.contains("backhaul_state_sync_failures_total 1"),
            "metrics: \(text.split(separator: "\n").filter { $0.contains("sync") })")

        let exit = fixture.daemon.waitForExit(timeout: 30)
        fixture.expectLog(exit == 75, "the daemon's exit: \(exit.map(String.init) ?? "still running")")
        let log = fixture.daemon.log(lastLines: 200)
        #expect(log.contains("a sync of the state failed") && log.contains("\"errno\":\"\(name)\""), "no log line names \(name)")
        #expect((try? String(contentsOfFile: faults, encoding: .utf8))?.contains("fdatasync") == true, "no sync was failed")

        fixture.daemon.environment = [:]
        try fixture.daemon.start()
        for id in acknowledged {
            let (found, record) = try fixture.daemon.call("GET", "/v1/tasks/\(id)")
            #expect(
                found == 200 && record["id"]?.stringValue == id && record["state"]?.stringValue == "waiting",
                "\(id): \(found) \(record.serialized())")
        }
        let (readyAgain, _) = try fixture.daemon.call("GET", "/readyz")
        #expect(readyAgain == 200)
    }
}

/// The fault-injecting preload, compiled once per test run from Tests/preload/syncfault.c.
enum SyncFaultLibrary {
    private static let built: Result<String, BuildError> = {
        let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("preload/syncfault.c").path
        let output = NSTemporaryDirectory() + "backhaul-syncfault-\(getpid()).so"
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/cc")
        process.arguments = ["-shared", "-fPIC", "-O2", "-o", output, source, "-ldl"]
        do {
            try process.run()
            process.waitUntilExit()
        } catch {
            return .failure(BuildError(description: "cannot run cc: \(error)"))
        }
        guard process.terminationStatus == 0 else {
            return .failure(BuildError(description: "cc \(source) exited \(process.terminationStatus)"))
        }
        return .success(output)
    }()

    struct BuildError: Error, CustomStringConvertible {
        var description: String
    }

    static func path() throws -> String { try built.get() }
}
