import BackhaulTesting
import Curl
import Foundation
import Glibc
import JSONCodec
import Testing

extension Fixture {
    /// Enqueues one download into `data/<name>` and returns its id.
    func enqueueDownload(_ url: String, to name: String, extra: JSONObject = [:]) throws -> String {
        var object: JSONObject = [
            "kind": "download", "request": ["url": .string(url)], "destination": .string(data + "/" + name),
        ]
        for (key, value) in extra { object[key] = value }
        let (status, body) = try daemon.call("POST", "/v1/sessions/s1/tasks", .object(object))
        try #require(status == 201, "enqueue download: \(status) \(body.serialized())")
        return try #require(body["id"]?.stringValue)
    }

    func exists(_ path: String) -> Bool { FileManager.default.fileExists(atPath: path) }
}

/// The SHA-256 of a file, by the sha256sum tool (an independent implementation).
func sha256sum(_ path: String) -> String {
    let process = Process()
    let pipe = Pipe()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/sha256sum")
    process.arguments = [path]
    process.standardOutput = pipe
    try? process.run()
    let output = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return String(decoding: output, as: UTF8.self).split(separator: " ").first.map(String.init) ?? ""
}

extension EndToEndTests {
    @Test(
        "download from nginx: byte-exact, verified, renamed into place; no .part left; an existing file is kept unless overwrite")
    func nginxDownload() throws {
        let fixture = try Fixture()
        let nginx = try NginxServer(directory: fixture.scratch.file("nginx"))
        let source = fixture.scratch.makeFile("nginx/root/firmware.bin", size: 5 << 20)
        try fixture.session()
        let id = try fixture.enqueueDownload(
            nginx.url("/firmware.bin"), to: "firmware.bin",
            extra: ["expected_sha256": .string(sha256sum(source))])
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
        #expect(Bytes(fixture.contents(fixture.data + "/firmware.bin")) == Bytes(fixture.contents(source)))
        #expect(!fixture.exists(fixture.data + "/firmware.bin.part"))
        #expect(task["kind"]?.stringValue == "download")
        #expect(task["progress"]?["bytes_received"]?.intValue == 5 << 20)
        #expect(task["progress"]?["bytes_total"]?.intValue == 5 << 20)
        #expect(task["download"]?["destination"]?.stringValue == fixture.data + "/firmware.bin")
        #expect(task["response"]?["status"]?.intValue == 200)

        // The destination now exists: a second download there is refused unless it may overwrite.
        let refused = try fixture.daemon.call(
            "POST", "/v1/sessions/s1/tasks",
            [
                "kind": "download", "request": ["url": .string(nginx.url("/firmware.bin"))],
                "destination": .string(fixture.data + "/firmware.bin"),
            ])
        #expect(refused.0 == 409 && refused.1["code"]?.stringValue == "destination_exists", "\(refused)")
        try Data("old".utf8).write(to: URL(fileURLWithPath: fixture.data + "/firmware.bin"))
        let again = try fixture.enqueueDownload(nginx.url("/firmware.bin"), to: "firmware.bin", extra: ["overwrite": true])
        #expect(try fixture.daemon.waitForTask(again, timeout: 60)["state"]?.stringValue == "completed")
        #expect(Bytes(fixture.contents(fixture.data + "/firmware.bin")) == Bytes(fixture.contents(source)))

        // Bytes received reach /metrics (by network type) within a quarter of a second.
        let client = try HTTPClient()
        let counted = try eventually(timeout: 3) {
            let metrics = try client.send("GET", "http://127.0.0.1:\(fixture.daemon.port)/metrics")
            let figures = try PrometheusParser.parse(String(decoding: metrics.body, as: UTF8.self))
            return figures.filter { $0.key.hasPrefix("backhaul_received_bytes_total") }.values.reduce(0, +) >= Double(10 << 20)
        }
        #expect(counted, "received bytes are counted")
    }

    @Test("download: bad input is refused with a clear problem, nothing enqueued")
    func downloadValidation() throws {
        let fixture = try Fixture()
        try fixture.session()
        let url = JSON.string(fixture.sink.url("/f"))
        let cases: [(JSONObject, Int, String)] = [
            (["destination": "/etc/passwd-copy"], 403, "file_outside_allowed_roots"),
            (["destination": .string(fixture.data + "/missing/dir/f")], 422, "file_not_found"),
            (["destination": .string(fixture.data)], 422, "file_is_directory"),
            (["destination": "relative/f"], 422, "validation_failed"),
            (["destination": .string(fixture.data + "/f"), "expected_sha256": "abc"], 422, "validation_failed"),
            (["destination": .string(fixture.data + "/f"), "file": "/x"], 422, "validation_failed"),
            (
                ["destination": .string(fixture.data + "/f"), "request": ["url": url, "method": "POST"]], 422, "validation_failed"
            ),
        ]
        for (fields, status, code) in cases {
            var object: JSONObject = ["kind": "download", "request": ["url": url]]
            for (key, value) in fields { object[key] = value }
            let (answer, body) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", .object(object))
            #expect(answer == status && body["code"]?.stringValue == code, "\(fields): \(answer) \(body.serialized())")
        }
        let listed = try fixture.daemon.call("GET", "/v1/sessions/s1/tasks")
        #expect(listed.1["tasks"]?.arrayValue?.isEmpty == true)
    }

    @Test("download: drops mid-body resume with Range + If-Range; a server that ignores Range restarts from zero")
    func downloadResumes() throws {
        let size = 3 << 20
        for ignoreRange in [false, true] {
            let fixture = try Fixture()
            let server = try DownloadServer(
                directory: fixture.scratch.file("dl"),
                faults: .init(dropAfter: 1 << 20, dropTimes: 2, ignoreRange: ignoreRange))
            let source = fixture.scratch.makeFile("dl/served/data.bin", size: size)
            try fixture.session("s1", quickRetry)
            let id = try fixture.enqueueDownload(server.url("data.bin"), to: "data.bin")
            let task = try fixture.daemon.waitForTask(id, timeout: 60)
            fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
            #expect(
                Bytes(fixture.contents(fixture.data + "/data.bin")) == Bytes(fixture.contents(source)),
                "ignoreRange \(ignoreRange)")
            let requests = server.requests
            #expect(requests.count == 3, "\(requests)")
            if ignoreRange {
                #expect(requests.allSatisfy { $0["status"]?.intValue == 200 })
                #expect(requests.dropFirst().allSatisfy { $0["range"]?.stringValue != nil }, "it still asked for the rest")
            } else {
                #expect(requests.dropFirst().allSatisfy { $0["status"]?.intValue == 206 && $0["if_range"]?.stringValue != nil })
                #expect(server.bytesTransferred < Int64(Double(size) * 1.5), "fetched \(server.bytesTransferred) for \(size)")
            }
        }
    }

    @Test("download: the file changes at the server between attempts; the download restarts and ends with the new file")
    func downloadChangedFile() throws {
        for ignoreIfRange in [false, true] {
            let fixture = try Fixture()
            // The first body drops after 1 MiB, and the server replaces the file before it closes
            // that connection, so the retry always meets the new file.
            let replacement = fixture.scratch.file("dl/new.bin")
            let server = try DownloadServer(
                directory: fixture.scratch.file("dl"),
                faults: .init(
                    dropAfter: 1 << 20, dropTimes: 1, ignoreIfRange: ignoreIfRange,
                    replaceOnDrop: ("data.bin", replacement)))
            fixture.scratch.makeFile("dl/served/data.bin", size: 3 << 20)
            fixture.scratch.makeFile("dl/new.bin", size: (3 << 20) + 12345)
            let expected = fixture.contents(replacement)
            try fixture.session("s1", quickRetry)
            let id = try fixture.enqueueDownload(server.url("data.bin"), to: "data.bin")
            let task = try fixture.daemon.waitForTask(id, timeout: 60)
            fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
            #expect(Bytes(fixture.contents(fixture.data + "/data.bin")) == Bytes(expected), "ignoreIfRange \(ignoreIfRange)")
            let statuses = server.requests.compactMap { $0["status"]?.intValue }
            // A correct server answers the stale If-Range with 200; one that ignores it answers 206
            // with the new ETag, which the daemon refuses and asks again without a range.
            #expect(statuses == (ignoreIfRange ? [200, 206, 200] : [200, 200]), "\(server.requests)")
        }
    }

    @Test("download: SIGKILL mid-download, restart: resumes from the fsynced offset, under 1.5× the file fetched")
    func downloadSurvivesSigkill() throws {
        let fixture = try Fixture()
        let server = try DownloadServer(directory: fixture.scratch.file("dl"), faults: .init(bytesPerSecond: 4 << 20))
        let size = 12 << 20
        let source = fixture.scratch.makeFile("dl/served/big.bin", size: size)
        try fixture.session()
        let id = try fixture.enqueueDownload(server.url("big.bin"), to: "big.bin")
        try #require(
            eventually(timeout: 20) {
                ((try? fixture.daemon.call("GET", "/v1/tasks/\(id)"))?.1["progress"]?["bytes_received"]?.intValue ?? 0) > 5 << 20
            })
        fixture.daemon.kill9()
        try fixture.daemon.start()
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
        #expect(Bytes(fixture.contents(fixture.data + "/big.bin")) == Bytes(fixture.contents(source)))
        let fetched = server.bytesTransferred
        #expect(Double(fetched) < 1.5 * Double(size), "fetched \(fetched) for \(size)")
        // One full answer before the kill, one ranged answer after it (the server logs a request
        // when its body ends, so the killed one may be logged last).
        let statuses = server.requests.compactMap { $0["status"]?.intValue }.sorted()
        #expect(statuses == [200, 206], "\(server.requests)")
        print("download SIGKILL: \(fetched - Int64(size)) bytes re-fetched for a \(size)-byte file")
    }

    @Test("download: a wrong expected_sha256 fails -3006; nothing at the destination, no .part left")
    func downloadChecksumMismatch() throws {
        let fixture = try Fixture()
        let nginx = try NginxServer(directory: fixture.scratch.file("nginx"))
        fixture.scratch.makeFile("nginx/root/f.bin", size: 1 << 20)
        try fixture.session()
        let id = try fixture.enqueueDownload(
            nginx.url("/f.bin"), to: "f.bin",
            extra: ["expected_sha256": .string(String(repeating: "ab", count: 32))])
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(task["state"]?.stringValue == "failed", task.serialized())
        #expect(task["error"]?["code"]?.intValue == -3006)
        #expect(task["error"]?["message"]?.stringValue?.contains("expected_sha256") == true)
        #expect(!fixture.exists(fixture.data + "/f.bin"))
        #expect(!fixture.exists(fixture.data + "/f.bin.part"))
    }

    /// Content-Length is checked against the free space before any byte is written; without it,
    /// the write that finds the disk full stops the download. Both cancel with reason 2.
    @Test(
        "download: a destination on a tiny tmpfs is cancelled with reason 2 and leaves no .part file",
        .enabled(if: canMountTmpfs, "needs permission to mount a tmpfs"), arguments: [false, true])
    func downloadDiskFull(sizeUnknown: Bool) throws {
        let fixture = try Fixture()
        let server = try DownloadServer(directory: fixture.scratch.file("dl"), faults: .init(noLength: sizeUnknown))
        fixture.scratch.makeFile("dl/served/big.bin", size: 4 << 20)
        let volume = fixture.data + "/tiny"
        try FileManager.default.createDirectory(atPath: volume, withIntermediateDirectories: true)
        try #require(mount("tmpfs", volume, "tmpfs", 0, "size=1m") == 0)
        defer { umount2(volume, Int32(MNT_DETACH)) }
        try fixture.session()
        let id = try fixture.enqueueDownload(server.url("big.bin"), to: "tiny/big.bin")
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(task["state"]?.stringValue == "cancelled", task.serialized())
        #expect(task["cancellation"]?["reason_code"]?.intValue == 2)
        #expect(task["cancellation"]?["reason"]?.stringValue == "insufficient_system_resources")
        #expect(eventually(timeout: 5) { !fixture.exists(volume + "/big.bin.part") })
        #expect(!fixture.exists(volume + "/big.bin"))
        // A full disk is not retried (the server logs a request once it stops sending).
        #expect(eventually(timeout: 5) { !server.requests.isEmpty })
        Thread.sleep(forTimeInterval: 0.5)
        #expect(server.requests.count == 1, "\(server.requests)")
    }

    @Test("download: cancelling a queued download with a .part file removes it")
    func downloadCancelRemovesPart() throws {
        let fixture = try Fixture()
        let server = try DownloadServer(directory: fixture.scratch.file("dl"), faults: .init(bytesPerSecond: 1 << 20))
        fixture.scratch.makeFile("dl/served/slow.bin", size: 8 << 20)
        try fixture.session()
        let id = try fixture.enqueueDownload(server.url("slow.bin"), to: "slow.bin")
        try #require(eventually(timeout: 20) { fixture.exists(fixture.data + "/slow.bin.part") })
        #expect(try fixture.daemon.call("POST", "/v1/tasks/\(id)/cancel").0 == 200)
        #expect(eventually(timeout: 10) { !fixture.exists(fixture.data + "/slow.bin.part") })
        #expect(try fixture.daemon.waitForTask(id)["state"]?.stringValue == "cancelled")
    }
}
