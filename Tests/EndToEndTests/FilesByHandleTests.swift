import BackhaulTesting
import Curl
import Foundation
import Glibc
import JSONCodec
import Testing

/// Issue 47.1, files by handle (docs/security.md): a directory of a task's path swapped for a
/// symbolic link to a directory outside the allowed roots, at each moment a task can meet it. The
/// outside directory holds a file of the same name, size and modification time, as someone who
/// can write in a root and wants the daemon to upload or delete a file it may not reach would
/// make it. Every one of these failed on the code before: the upload read or deleted the outside
/// file, the download wrote there.
extension Fixture {
    /// `data/d/<name>` of `size` bytes, and `outside/<name>` alike in size and modification time.
    func swapTarget(_ name: String, size: Int) throws -> (inside: String, outside: String) {
        try FileManager.default.createDirectory(atPath: data + "/d", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: scratch.file("outside"), withIntermediateDirectories: true)
        let inside = makeFile("d/" + name, size: size)
        let outside = scratch.makeFile("outside/" + name, size: size)
        var times = [timespec](repeating: timespec(), count: 2)
        var info = stat()
        stat(inside, &info)
        times[0] = info.st_atim
        times[1] = info.st_mtim
        utimensat(AT_FDCWD, outside, &times, 0)
        return (inside, outside)
    }

    /// `data/d` becomes `data/d.old`, and `data/d` a symbolic link to `outside`.
    func swapDirectory() throws {
        try #require(rename(data + "/d", data + "/d.old") == 0)
        try #require(symlink(scratch.file("outside"), data + "/d") == 0)
    }

    func expectPathChanged(_ task: JSON) {
        expectLog(
            task["state"]?.stringValue == "failed" && task["error"]?["code"]?.intValue == -4001
                && task["error"]?["reason"]?.stringValue == "path_changed",
            task.serialized())
    }
}

extension EndToEndTests {
    @Test(
        "files by handle: a directory swapped for a link outside the roots during an upload with delete; nothing outside is hit")
    func swapDuringUploadWithDelete() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 1 << 20, then: .respond(status: 201)))
        try fixture.session()
        let (inside, outside) = try fixture.swapTarget("f", size: 3 << 20)
        let id = try fixture.enqueue(inside, extra: ["delete_file_on_success": true])
        try #require(eventually(timeout: 20) { fixture.sink.requests.count > 0 })
        try fixture.swapDirectory()
        let task = try fixture.daemon.waitForTask(id, timeout: 30)
        fixture.expectPathChanged(task)
        #expect(fixture.exists(outside), "the file outside the roots survives")
        #expect(fixture.exists(fixture.data + "/d.old/f"), "the task's own file is left alone too")
    }

    @Test(
        "files by handle: a directory swapped between enqueue and start; the task fails and reads nothing (also by the per-component walk)"
    )
    func swapBeforeStart() throws {
        for environment in [[:], ["BACKHAUL_FILES_WALK": "components"]] {
            let fixture = try Fixture(environment: environment)
            try fixture.session()
            let (inside, outside) = try fixture.swapTarget("f", size: 100_000)
            let begin = ISO8601DateFormatter().string(from: Date().addingTimeInterval(3))
            let id = try fixture.enqueue(inside, extra: ["delete_file_on_success": true, "earliest_begin_at": .string(begin)])
            try fixture.swapDirectory()
            let task = try fixture.daemon.waitForTask(id, timeout: 30)
            fixture.expectPathChanged(task)
            #expect(fixture.exists(outside), "\(environment)")
            #expect(fixture.sink.requests.isEmpty, "nothing was sent (\(environment))")
        }
    }

    @Test("files by handle: a directory swapped while the daemon is down; the resumed upload fails and the outside file stays")
    func swapAcrossRestart() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 1 << 20, then: .respond(status: 201)))
        try fixture.session()
        let (inside, outside) = try fixture.swapTarget("f", size: 4 << 20)
        let id = try fixture.enqueue(inside, extra: ["delete_file_on_success": true])
        try #require(eventually(timeout: 20) { fixture.sink.requests.count > 0 })
        fixture.daemon.kill9()
        try fixture.swapDirectory()
        fixture.sink.setFallback(.respond(status: 201))
        try fixture.daemon.start()
        let task = try fixture.daemon.waitForTask(id, timeout: 30)
        fixture.expectPathChanged(task)
        #expect(fixture.exists(outside))
        #expect(fixture.sink.requests.count == 1, "no attempt after the restart: \(fixture.sink.requests.count)")
    }

    @Test(
        "files by handle: a download's directory swapped mid-body, with and without a drop after; nothing outside, no .part left")
    func swapDuringDownload() throws {
        for drop in [false, true] {
            let fixture = try Fixture()
            let size = 4 << 20
            let server = try DownloadServer(
                directory: fixture.scratch.file("dl"),
                faults: .init(dropAfter: drop ? 2 << 20 : 0, dropTimes: drop ? 1 : 0, bytesPerSecond: 1 << 20))
            fixture.scratch.makeFile("dl/served/out.bin", size: size)
            try fixture.session("s1", quickRetry)
            try FileManager.default.createDirectory(atPath: fixture.data + "/d", withIntermediateDirectories: true)
            try FileManager.default.createDirectory(atPath: fixture.scratch.file("outside"), withIntermediateDirectories: true)
            let id = try fixture.enqueueDownload(server.url("out.bin"), to: "d/out.bin")
            try #require(eventually(timeout: 20) { fixture.exists(fixture.data + "/d/out.bin.part") })
            try fixture.swapDirectory()
            let task = try fixture.daemon.waitForTask(id, timeout: 40)
            fixture.expectPathChanged(task)
            let outside = (try? FileManager.default.contentsOfDirectory(atPath: fixture.scratch.file("outside"))) ?? []
            #expect(outside.isEmpty, "nothing written outside the roots (drop \(drop)): \(outside)")
            let moved = (try? FileManager.default.contentsOfDirectory(atPath: fixture.data + "/d.old")) ?? []
            #expect(moved.isEmpty, "no .part and no out.bin left (drop \(drop)): \(moved)")
        }
    }
}

/// Whether this machine lets the tests make a read-only bind mount (root in a namespace that may
/// mount): what the packaged unit's `ReadOnlyPaths=` does to a root.
func canBindMountReadOnly() -> Bool {
    let scratch = TemporaryDirectory("backhaul-mount")
    let directory = scratch.file("probe")
    try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    guard run("/bin/mount", ["--bind", directory, directory]) else { return false }
    defer { _ = run("/bin/umount", [directory]) }
    return run("/bin/mount", ["-o", "remount,bind,ro", directory])
}

@discardableResult
func run(_ program: String, _ arguments: [String]) -> Bool {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: program)
    process.arguments = arguments
    process.standardError = FileHandle.nullDevice
    guard (try? process.run()) != nil else { return false }
    process.waitUntilExit()
    return process.terminationStatus == 0
}

extension EndToEndTests {
    @Test(
        "delete_file_on_success in a read-only root: the upload completes, and the failed removal is logged, counted and on the task",
        .enabled(if: canBindMountReadOnly(), "needs a read-only bind mount"))
    func removalFailureIsNotSilent() throws {
        let fixture = try Fixture()
        try fixture.session()
        let directory = fixture.data + "/ro"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let file = fixture.makeFile("ro/a.bin", size: 50_000)
        try #require(run("/bin/mount", ["--bind", directory, directory]))
        defer { run("/bin/umount", [directory]) }
        try #require(run("/bin/mount", ["-o", "remount,bind,ro", directory]))
        let id = try fixture.enqueue(file, extra: ["delete_file_on_success": true])
        var task: JSON = .null
        let noted = try eventually(timeout: 20) {
            task = try fixture.daemon.call("GET", "/v1/tasks/\(id)").1
            return task["last_error"]?["code"]?.intValue == -3004
        }
        fixture.expectLog(noted && task["state"]?.stringValue == "completed", task.serialized())
        #expect(task["last_error"]?["name"]?.stringValue == "cannot_remove_file")
        #expect(fixture.exists(file))
        let metrics = try HTTPClient().send("GET", "http://127.0.0.1:\(fixture.daemon.port)/metrics")
        let text = String(decoding: metrics.body, as: UTF8.self)
        #expect(
            text.contains("backhaul_file_removals_failed_total 1"),
            "\(text.split(separator: "\n").filter { $0.contains("removal") })")
        let warning = fixture.daemon.log(lastLines: 10_000).split(separator: "\n").first { $0.contains("a file was not removed") }
        #expect(
            warning.map { $0.contains(id) && $0.contains("\"errno\":\"\(EROFS)\"") } == true, "\(warning ?? "no warning logged")")
    }
}
