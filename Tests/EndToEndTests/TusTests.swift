import BackhaulTesting
import Foundation
import JSONCodec
import Testing

extension EndToEndTests {
    func enqueueTus(_ fixture: Fixture, _ tus: TusServer, file: String, chunk: Int) throws -> String {
        try fixture.enqueue(
            file,
            extra: [
                "request": ["url": .string(tus.creationURL), "method": "POST"],
                "upload": ["protocol": "tus", "chunk_size": .int(Int64(chunk)), "content_type": "video/mp4"],
            ])
    }

    @Test("tus: creation and PATCHes to tuspyserver arrive byte-exact")
    func tusUpload() throws {
        let fixture = try Fixture()
        let tus = try TusServer(directory: fixture.scratch.path)
        try fixture.session()
        let file = fixture.makeFile("clip.mp4", size: 3 * 1024 * 1024 + 77)
        let task = try fixture.daemon.waitForTask(try enqueueTus(fixture, tus, file: file, chunk: 1 << 20))
        fixture.expectLog(
            task["state"]?.stringValue == "completed", "\(task.serialized()) \(tus.requests.map { $0.serialized() })")
        let uploads = tus.uploads
        try #require(uploads.count == 1)
        #expect(Bytes(fixture.contents(uploads[0])) == Bytes(fixture.contents(file)))
        #expect(tus.requests.map { $0["method"]?.stringValue } == ["POST", "PATCH", "PATCH", "PATCH", "PATCH"])
    }

    /// Enqueues `file` in 1 MiB PATCHes, SIGKILLs the daemon after the third, starts it again, and
    /// gives the task's id and its end.
    func killedMidUpload(_ fixture: Fixture, _ tus: TusServer, file: String) throws -> (String, JSON) {
        let id = try enqueueTus(fixture, tus, file: file, chunk: 1 << 20)
        try #require(eventually(timeout: 30) { tus.requests.filter { $0["method"]?.stringValue == "PATCH" }.count >= 3 })
        fixture.daemon.kill9()
        try fixture.daemon.start()
        return (id, try fixture.daemon.waitForTask(id, timeout: 90))
    }

    @Test("tus: SIGKILL mid-upload, restart: HEAD, then the rest; under 1.5× the file sent")
    func tusSurvivesSigkill() throws {
        let fixture = try Fixture()
        let tus = try TusServer(directory: fixture.scratch.path)
        try fixture.session()
        let size = 48 * 1024 * 1024
        let file = fixture.makeFile("big.mp4", size: size)
        let (_, task) = try killedMidUpload(fixture, tus, file: file)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(Bytes(fixture.contents(tus.uploads.first ?? "")) == Bytes(fixture.contents(file)))
        let sent = PythonPeer.bodyBytes(tus.requests, method: "PATCH")
        #expect(Double(sent) < 1.5 * Double(size), "sent \(sent) for \(size)")
        #expect(tus.requests.contains { $0["method"]?.stringValue == "HEAD" })
        #expect(tus.uploads.count == 1, "the restart resumed the same upload")
        print("tus SIGKILL: \(sent - Int64(size)) bytes re-sent for a \(size)-byte file")
    }

    @Test(
        "tus: SIGKILL mid-upload, restart, 423 Locked to the first PATCHes: retried as tus-js-client does, completes byte-exact")
    func tusLockedAfterRestart() throws {
        let fixture = try Fixture()
        let tus = try TusServer(directory: fixture.scratch.path, lockedAfterHead: 2)
        try fixture.session("s1", quickRetry)
        let size = 24 * 1024 * 1024 + 11
        let file = fixture.makeFile("locked.mp4", size: size)
        let (id, task) = try killedMidUpload(fixture, tus, file: file)
        let log = tus.requests.map { "\($0["method"]?.stringValue ?? "") \($0["status"]?.intValue ?? 0)" }
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized()) \(log)")
        #expect(Bytes(fixture.contents(tus.uploads.first ?? "")) == Bytes(fixture.contents(file)))
        #expect(tus.uploads.count == 1, "the same upload resumed")
        #expect(tus.requests.filter { $0["status"]?.intValue == 423 }.count == 2, "\(log)")
        let attempts = try fixture.daemon.call("GET", "/v1/tasks/\(id)/attempts").1["attempts"]?.arrayValue ?? []
        #expect(attempts.contains { $0["error"]?["http_status"]?.intValue == 423 && $0["outcome"]?.stringValue == "retry" })
    }

    @Test("tus: cancel terminates the upload at the server (DELETE)")
    func tusCancelTerminates() throws {
        let fixture = try Fixture()
        let tus = try TusServer(directory: fixture.scratch.path)
        try fixture.session()
        let file = fixture.makeFile("big.mp4", size: 64 * 1024 * 1024)
        let id = try enqueueTus(fixture, tus, file: file, chunk: 1 << 20)
        try #require(eventually(timeout: 30) { tus.requests.contains { $0["method"]?.stringValue == "PATCH" } })
        #expect(try fixture.daemon.call("POST", "/v1/tasks/\(id)/cancel").1["state"]?.stringValue == "cancelled")
        let deleted = eventually(timeout: 15) {
            tus.requests.contains { $0["method"]?.stringValue == "DELETE" && $0["status"]?.intValue == 204 }
        }
        fixture.expectLog(deleted, "requests: \(tus.requests.map { $0.serialized() })")
        #expect(eventually(timeout: 5) { tus.uploads.isEmpty })
    }
}

extension EndToEndTests {
    @Test("tus: a 503 on one PATCH re-sends only that chunk")
    func tusFaultResendsOneChunk() throws {
        let fixture = try Fixture()
        let tus = try TusServer(directory: fixture.scratch.path, failPatch: 2)
        try fixture.session("s1", quickRetry)
        let size = 4 * 1024 * 1024
        let file = fixture.makeFile("a.mp4", size: size)
        let task = try fixture.daemon.waitForTask(try enqueueTus(fixture, tus, file: file, chunk: 1 << 20))
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(Bytes(fixture.contents(tus.uploads.first ?? "")) == Bytes(fixture.contents(file)))
        let patches = tus.requests.filter { $0["method"]?.stringValue == "PATCH" }
        #expect(patches.map { $0["upload_offset"]?.stringValue } == ["0", "1048576", "1048576", "2097152", "3145728"])
        #expect(patches.map { $0["status"]?.intValue } == [204, 503, 204, 204, 204])
    }
}
