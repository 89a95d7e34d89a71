import BackhaulTesting
import Curl
import Foundation
import Glibc
import JSONCodec
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

/// A clean stop leaves the state in `backhaul.db` alone, and a backup taken while transfers run is
/// a whole, consistent database (docs/operations.md, "Backups").
extension EndToEndTests {
    @Test("SIGTERM copies the log back: backhaul.db alone, copied to a new state directory, holds every task")
    func cleanStopLeavesOneFile() throws {
        let fixture = try Fixture()
        try fixture.session("s1")
        #expect(try fixture.daemon.call("PATCH", "/v1/sessions/s1", ["enabled": false]).0 == 200)
        let file = fixture.makeFile("a.bin", size: 100)
        var ids: [String] = []
        for index in 0..<200 { ids.append(try fixture.enqueue(file, path: "/one/\(index)")) }
        #expect(fixture.daemon.terminate() == 0)
        let state = fixture.daemon.stateDirectory
        let wal = (try? FileManager.default.attributesOfItem(atPath: state + "/backhaul.db-wal")[.size] as? Int) ?? 0
        #expect(wal == 0, "the log holds \(wal) bytes after a clean stop")

        let alone = fixture.scratch.file("alone")
        try FileManager.default.createDirectory(atPath: alone, withIntermediateDirectories: false)
        try FileManager.default.copyItem(atPath: state + "/backhaul.db", toPath: alone + "/backhaul.db")
        let copy = try DaemonProcess(stateDirectory: alone, allowedRoot: fixture.data)
        for id in ids {
            let (status, _) = try copy.call("GET", "/v1/tasks/\(id)")
            #expect(status == 200, "\(id) is not in backhaul.db alone")
        }
        _ = copy.terminate()
    }

    @Test("backhaul backup FILE writes a consistent copy while transfers run, and refuses to replace a file")
    func backupWhileRunning() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 2_000_000, then: .respond(status: 201)))
        try fixture.session("s1")
        var ids: [String] = []
        for index in 0..<20 {
            ids.append(try fixture.enqueue(fixture.makeFile("f\(index).bin", size: 200_000), path: "/b/\(index)"))
        }
        let target = fixture.scratch.file("copy.db")
        let (status, output, errors) = try cli(fixture, ["backup", target])
        #expect(status == 0, "backhaul backup: \(output) \(errors)")
        // Transfers went on, and all complete.
        for id in ids { #expect(try fixture.daemon.waitForTask(id, timeout: 60)["state"]?.stringValue == "completed") }
        #expect(!FileManager.default.fileExists(atPath: target + "-wal"))
        let copy = fixture.scratch.file("restored")
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: false)
        try FileManager.default.copyItem(atPath: target, toPath: copy + "/backhaul.db")
        let restored = try DaemonProcess(stateDirectory: copy, allowedRoot: fixture.data, arguments: ["--log-level", "info"])
        for id in ids {
            let (found, record) = try restored.call("GET", "/v1/tasks/\(id)")
            #expect(found == 200, "\(id) is not in the backup: \(record.serialized())")
        }
        _ = restored.terminate()
        let (again, body) = try fixture.daemon.call("POST", "/v1/admin/backup", ["path": .string(target)])
        #expect(again == 409, "a second backup to the same file: \(again) \(body.serialized())")
        let (relative, _) = try fixture.daemon.call("POST", "/v1/admin/backup", ["path": "copy.db"])
        #expect(relative == 422)
    }
}
