import BackhaulTesting
import Curl
import Foundation
import JSONCodec
import Testing

/// `ietf` and `auto` against Apple's server code (NIOResumableUpload in Tests/IETFPeer).
extension EndToEndTests {
    /// A peer behind a throttling proxy: the upload resource URLs it hands out name the proxy, so
    /// every request of the upload goes through the slow link (and dies with it).
    final class ThrottledIETF {
        let server: IETFServer
        let proxy: ThrottleProxy

        init(_ fixture: Fixture, rate: Int, versions: [Int] = [3, 5, 6]) throws {
            let peerPort = try freePort()
            proxy = try ThrottleProxy(target: peerPort, rate: rate)
            server = try IETFServer(
                directory: fixture.scratch.path, port: peerPort, origin: "http://127.0.0.1:\(proxy.port)",
                versions: versions)
        }

        func url(_ path: String) -> String { "http://127.0.0.1:\(proxy.port)\(path)" }
    }

    func enqueueIETF(_ fixture: Fixture, url: String, file: String, upload: JSONObject = [:], session: String = "s1") throws
        -> String
    {
        var object: JSONObject = ["protocol": "ietf"]
        for (key, value) in upload { object[key] = value }
        return try fixture.enqueue(
            file, session: session, extra: ["request": ["url": .string(url), "method": "POST"], "upload": .object(object)])
    }

    func requests(_ server: IETFServer, _ method: String) -> [JSON] {
        server.requests.filter { $0["method"]?.stringValue == method }
    }

    /// Body bytes the server received over every request of the upload (creation and appends).
    func received(_ server: IETFServer) -> Int64 {
        PythonPeer.bodyBytes(server.requests, method: "POST") + PythonPeer.bodyBytes(server.requests, method: "PATCH")
    }

    /// Waits for the daemon's log to say it saved the upload resource the 104 named.
    func waitForSavedResource(_ fixture: Fixture, task id: String, timeout: Double = 30) -> Bool {
        eventually(timeout: timeout) {
            let log = (try? String(contentsOfFile: fixture.daemon.logFile, encoding: .utf8)) ?? ""
            return log.split(separator: "\n").contains { $0.contains("\"msg\":\"upload resource saved\"") && $0.contains(id) }
        }
    }

    func log(_ server: IETFServer) -> String { server.requests.map { $0.serialized() }.joined(separator: "\n") }

    @Test("ietf: 24 MiB to Apple's server arrive byte-exact; OPTIONS settles version 6, the 104 names the resource")
    func ietfUpload() throws {
        let fixture = try Fixture()
        let server = try IETFServer(directory: fixture.scratch.path)
        try fixture.session()
        let size = 24 * 1024 * 1024
        let file = fixture.makeFile("clip.mp4", size: size)
        let task = try fixture.daemon.waitForTask(
            try enqueueIETF(fixture, url: server.url("/up/clip.mp4"), file: file), timeout: 60)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())\n\(log(server))")
        try #require(server.uploads.count == 1)
        #expect(Bytes(fixture.contents(server.uploads[0])) == Bytes(fixture.contents(file)))
        #expect(server.requests.map { $0["method"]?.stringValue } == ["OPTIONS", "POST"])
        let creation = try #require(requests(server, "POST").first)
        #expect(creation["interop_version"]?.stringValue == "6" && creation["upload_complete"]?.stringValue == "?1")
        #expect(creation["informational"]?.arrayValue?.compactMap(\.intValue) == [104])
        #expect(creation["status"]?.intValue == 201 && creation["content_length"]?.intValue == Int64(size))
        #expect(task["upload"]?["interop_version_selected"]?.intValue == 6)
        #expect(task["response"]?["status"]?.intValue == 201)
    }

    @Test(
        "ietf: each interop version (3, 5, 6) pinned; unpinned against a server of version 3 only, OPTIONS finds 3",
        arguments: [(3, [3, 5, 6], "3"), (5, [3, 5, 6], "5"), (6, [3, 5, 6], "6"), (nil, [3], "3")] as [(Int?, [Int], String)])
    func ietfVersions(_ pinned: Int?, _ versions: [Int], _ expected: String) throws {
        let fixture = try Fixture()
        let server = try IETFServer(directory: fixture.scratch.path, versions: versions)
        try fixture.session()
        let file = fixture.makeFile("v.bin", size: 3 * 1024 * 1024 + 5)
        let upload: JSONObject = pinned.map { ["interop_version": .int(Int64($0))] } ?? [:]
        let task = try fixture.daemon.waitForTask(
            try enqueueIETF(fixture, url: server.url("/up/v.bin"), file: file, upload: upload))
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())\n\(log(server))")
        #expect(Bytes(fixture.contents(server.uploads.first ?? "")) == Bytes(fixture.contents(file)))
        let creation = try #require(requests(server, "POST").first)
        #expect(creation["interop_version"]?.stringValue == expected)
        #expect(
            creation[expected == "3" ? "upload_incomplete" : "upload_complete"]?.stringValue == (expected == "3" ? "?0" : "?1"))
        #expect(creation["informational"]?.arrayValue?.compactMap(\.intValue) == [104])
        #expect(task["upload"]?["interop_version_selected"]?.intValue == Int64(expected))
    }

    @Test("ietf: a pinned version the server refuses fails the task with the server's 400")
    func ietfPinnedRefused() throws {
        let fixture = try Fixture()
        let server = try IETFServer(directory: fixture.scratch.path, versions: [3])
        try fixture.session()
        let file = fixture.makeFile("v.bin", size: 1024 * 1024)
        let task = try fixture.daemon.waitForTask(
            try enqueueIETF(
                fixture, url: server.url("/up/v.bin"), file: file,
                upload: ["interop_version": 6]))
        fixture.expectLog(
            task["state"]?.stringValue == "failed" && task["error"]?["http_status"]?.intValue == 400,
            "\(task.serialized())\n\(log(server))")
        #expect(server.uploads.isEmpty)
    }

    @Test("ietf: SIGKILL past the middle, restart: HEAD, one PATCH with the rest; under 1.5× the file sent")
    func ietfSurvivesSigkill() throws {
        let fixture = try Fixture()
        let peer = try ThrottledIETF(fixture, rate: 4_000_000)
        try fixture.session()
        let size = 24 * 1024 * 1024
        let file = fixture.makeFile("big.mp4", size: size)
        let id = try enqueueIETF(fixture, url: peer.url("/up/big.mp4"), file: file)
        // Past half: starting over would send at least 1.5× the file.
        try #require(eventually(timeout: 30) { peer.server.partialBytes >= Int64(size / 2 + 1024 * 1024) }, "\(log(peer.server))")
        fixture.daemon.kill9()
        try fixture.daemon.start()
        let task = try fixture.daemon.waitForTask(id, timeout: 90)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())\n\(log(peer.server))")
        try #require(peer.server.uploads.count == 1)
        #expect(Bytes(fixture.contents(peer.server.uploads[0])) == Bytes(fixture.contents(file)))
        #expect(requests(peer.server, "POST").count == 1, "the restart resumed instead of creating again")
        #expect(!requests(peer.server, "HEAD").isEmpty)
        let append = try #require(requests(peer.server, "PATCH").last)
        let resumedAt = Int64(append["upload_offset"]?.stringValue ?? "") ?? 0
        #expect(
            resumedAt >= Int64(size / 2) && append["status"]?.intValue == 201
                && append["content_type"]?.stringValue == "application/partial-upload")
        let sent = received(peer.server)
        #expect(Double(sent) < 1.5 * Double(size), "sent \(sent) for \(size)")
        let attempts = try fixture.daemon.call("GET", "/v1/tasks/\(id)/attempts").1["attempts"]?.arrayValue ?? []
        let pushed = attempts.reduce(Int64(0)) { $0 + ($1["bytes_sent"]?.intValue ?? 0) }
        print(
            "ietf SIGKILL: \(sent - Int64(size)) bytes re-sent for a \(size)-byte file (resumed at \(resumedAt)); "
                + "the daemon's attempts record \(pushed) bytes sent")
    }

    @Test("ietf: SIGKILL right after the 104, before the final answer: the saved resource resumes, no second creation")
    func ietfSigkillAfter104() throws {
        let fixture = try Fixture()
        let peer = try ThrottledIETF(fixture, rate: 2_000_000)
        try fixture.session()
        let size = 24 * 1024 * 1024
        let file = fixture.makeFile("big.mp4", size: size)
        let id = try enqueueIETF(fixture, url: peer.url("/up/big.mp4"), file: file)
        try #require(waitForSavedResource(fixture, task: id), "\(log(peer.server))")
        fixture.daemon.kill9()
        let creation = try #require(
            eventually(timeout: 10) { !requests(peer.server, "POST").isEmpty } ? requests(peer.server, "POST")[0] : nil)
        #expect(
            creation["status"] == .null && creation["aborted"]?.boolValue == true,
            "the final answer had not come: \(creation.serialized())")
        try fixture.daemon.start()
        let task = try fixture.daemon.waitForTask(id, timeout: 90)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())\n\(log(peer.server))")
        #expect(Bytes(fixture.contents(peer.server.uploads.first ?? "")) == Bytes(fixture.contents(file)))
        #expect(requests(peer.server, "POST").count == 1, "\(log(peer.server))")
        #expect(!requests(peer.server, "HEAD").isEmpty && requests(peer.server, "PATCH").last?["status"]?.intValue == 201)
        #expect(peer.server.uploads.count == 1)
        let sent = received(peer.server)
        #expect(Double(sent) < 1.5 * Double(size), "sent \(sent) for \(size)")
    }

    @Test("ietf: a dropped link mid-upload (the proxy killed and started again) resumes with HEAD and PATCH")
    func ietfDropResumes() throws {
        let fixture = try Fixture()
        let peer = try ThrottledIETF(fixture, rate: 4_000_000)
        try fixture.session("s1", quickRetry)
        let size = 24 * 1024 * 1024
        let file = fixture.makeFile("big.mp4", size: size)
        let id = try enqueueIETF(fixture, url: peer.url("/up/big.mp4"), file: file)
        try #require(eventually(timeout: 30) { peer.server.partialBytes >= 6 * 1024 * 1024 }, "\(log(peer.server))")
        peer.proxy.peer.stop()
        Thread.sleep(forTimeInterval: 0.5)
        try peer.proxy.peer.start()
        let task = try fixture.daemon.waitForTask(id, timeout: 90)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())\n\(log(peer.server))")
        #expect(Bytes(fixture.contents(peer.server.uploads.first ?? "")) == Bytes(fixture.contents(file)))
        #expect(requests(peer.server, "POST").count == 1 && peer.server.uploads.count == 1, "\(log(peer.server))")
        let append = try #require(requests(peer.server, "PATCH").last)
        #expect(Int64(append["upload_offset"]?.stringValue ?? "") ?? 0 >= 6 * 1024 * 1024)
        #expect(Double(received(peer.server)) < 1.5 * Double(size))
        #expect(
            try fixture.daemon.call("GET", "/v1/tasks/\(id)/attempts").1["attempts"]?.arrayValue?.contains {
                $0["outcome"]?.stringValue == "retry"
            } == true)
    }

    @Test("ietf: cancel deletes the upload resource at the server (DELETE, then it answers 404)")
    func ietfCancelDeletes() throws {
        let fixture = try Fixture()
        let peer = try ThrottledIETF(fixture, rate: 1_000_000)
        try fixture.session()
        let file = fixture.makeFile("big.mp4", size: 24 * 1024 * 1024)
        let id = try enqueueIETF(fixture, url: peer.url("/up/big.mp4"), file: file)
        try #require(waitForSavedResource(fixture, task: id))
        try #require(eventually(timeout: 20) { peer.server.partialBytes > 0 })
        #expect(try fixture.daemon.call("POST", "/v1/tasks/\(id)/cancel").1["state"]?.stringValue == "cancelled")
        let deleted = eventually(timeout: 15) { requests(peer.server, "DELETE").contains { $0["status"]?.intValue == 204 } }
        fixture.expectLog(deleted, "requests: \(log(peer.server))")
        let resource = try #require(requests(peer.server, "DELETE").first?["path"]?.stringValue)
        #expect(resource.hasPrefix("/resumable_upload/"))
        #expect(eventually(timeout: 5) { peer.server.partialUploads.isEmpty }, "the partial upload is gone")
        let probe = try HTTPClient().send("HEAD", peer.server.url(resource), headers: ["Upload-Draft-Interop-Version: 6"])
        #expect(probe.status == 404)
        #expect(peer.server.uploads.isEmpty)
    }

    @Test("ietf checksum: a server that wants Repr-Digest gets it; a byte damaged on the way is refused, never stored")
    func ietfChecksum() throws {
        let fixture = try Fixture()
        let good = try IETFServer(directory: fixture.scratch.file("good"), wantDigest: true)
        let damaged = try IETFServer(directory: fixture.scratch.file("damaged"), wantDigest: true, corruptAt: 1_000_000)
        let plain = try IETFServer(directory: fixture.scratch.file("plain"))
        try fixture.session()
        let file = fixture.makeFile("c.bin", size: 3 * 1024 * 1024)
        let checksum: JSONObject = ["checksum": "sha256"]
        let ok = try fixture.daemon.waitForTask(
            try enqueueIETF(fixture, url: good.url("/up/c.bin"), file: file, upload: checksum))
        fixture.expectLog(ok["state"]?.stringValue == "completed", "\(ok.serialized())\n\(log(good))")
        #expect(Bytes(fixture.contents(good.uploads.first ?? "")) == Bytes(fixture.contents(file)))
        #expect(requests(good, "POST").first?["repr_digest"]?.stringValue?.hasPrefix("sha-256=:") == true)
        let bad = try fixture.daemon.waitForTask(
            try enqueueIETF(fixture, url: damaged.url("/up/c.bin"), file: file, upload: checksum))
        fixture.expectLog(
            bad["state"]?.stringValue == "failed" && bad["error"]?["http_status"]?.intValue == 400,
            "\(bad.serialized())\n\(log(damaged))")
        #expect(damaged.uploads.isEmpty)
        // A server that does not ask gets no digest (and no OPTIONS answer asks for one).
        let unasked = try fixture.daemon.waitForTask(
            try enqueueIETF(fixture, url: plain.url("/up/c.bin"), file: file, upload: checksum))
        #expect(unasked["state"]?.stringValue == "completed")
        #expect(requests(plain, "POST").first?["repr_digest"] == .null)
    }

    // MARK: auto

    func enqueueAuto(_ fixture: Fixture, url: String, file: String, method: String = "PUT") throws -> String {
        try fixture.enqueue(
            file,
            extra: [
                "request": ["url": .string(url), "method": .string(method)],
                "upload": ["protocol": "auto", "chunk_size": 1_048_576, "content_type": "video/mp4"],
            ])
    }

    @Test("auto: picks ietf for Apple's server (asking once per host), tus for tuspyserver, raw for nginx")
    func autoPicks() throws {
        let fixture = try Fixture()
        let ietf = try IETFServer(directory: fixture.scratch.path)
        let tus = try TusServer(directory: fixture.scratch.path)
        let nginx = try NginxServer(directory: fixture.scratch.file("nginx"))
        try fixture.session()
        let file = fixture.makeFile("a.mp4", size: 3 * 1024 * 1024 + 11)
        let expected: [(String, String)] = [
            (ietf.url("/up/a.mp4"), "ietf"), (tus.creationURL, "tus"), (nginx.url("/a.mp4"), "raw"),
        ]
        for (url, name) in expected {
            let task = try fixture.daemon.waitForTask(try enqueueAuto(fixture, url: url, file: file))
            fixture.expectLog(
                task["state"]?.stringValue == "completed" && task["upload"]?["protocol_selected"]?.stringValue == name,
                "\(name): \(task.serialized())")
            #expect(task["upload"]?["protocol"]?.stringValue == "auto")
        }
        #expect(Bytes(fixture.contents(ietf.uploads.first ?? "")) == Bytes(fixture.contents(file)))
        #expect(Bytes(fixture.contents(tus.uploads.first ?? "")) == Bytes(fixture.contents(file)))
        #expect(Bytes(fixture.contents(nginx.root + "/a.mp4")) == Bytes(fixture.contents(file)))
        #expect(tus.requests.map { $0["method"]?.stringValue }.filter { $0 == "PATCH" }.count == 4)
        // A second task to the same host: the pick is remembered, nothing is asked.
        let second = try fixture.daemon.waitForTask(try enqueueAuto(fixture, url: ietf.url("/up/b.mp4"), file: file))
        #expect(second["upload"]?["protocol_selected"]?.stringValue == "ietf" && second["state"]?.stringValue == "completed")
        #expect(requests(ietf, "OPTIONS").count == 1, "\(log(ietf))")
        #expect(requests(ietf, "PUT").count == 2 && ietf.uploads.count == 2)
    }

    @Test("auto: the server forgot the upload (Apple's server restarted): 404 on the resource, picked again, said in the task")
    func autoFallsBack() throws {
        let fixture = try Fixture()
        let peer = try ThrottledIETF(fixture, rate: 3_000_000)
        try fixture.session("s1", quickRetry)
        let size = 16 * 1024 * 1024
        let file = fixture.makeFile("f.mp4", size: size)
        let id = try enqueueAuto(fixture, url: peer.url("/up/f.mp4"), file: file, method: "POST")
        try #require(eventually(timeout: 30) { peer.server.partialBytes >= 4 * 1024 * 1024 }, "\(log(peer.server))")
        // The server restarts (forgetting every upload, as Apple's handler keeps them in memory)
        // and the link drops with it.
        peer.proxy.peer.stop()
        peer.server.stop()
        try peer.server.start()
        try peer.proxy.peer.start()
        let task = try fixture.daemon.waitForTask(id, timeout: 90)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())\n\(log(peer.server))")
        #expect(Bytes(fixture.contents(peer.server.uploads.first ?? "")) == Bytes(fixture.contents(file)))
        #expect(task["upload"]?["protocol_selected"]?.stringValue == "ietf")
        #expect(task["upload"]?["protocol_fallback"]?["from"]?.stringValue == "ietf")
        #expect(task["upload"]?["protocol_fallback"]?["status"]?.intValue == 404)
        #expect(requests(peer.server, "HEAD").contains { $0["status"]?.intValue == 404 }, "\(log(peer.server))")
    }
}

extension EndToEndTests {
    @Test("cli: upload --protocol auto and --protocol ietf --interop-version 5 to Apple's server")
    func commandLineIETF() throws {
        let fixture = try Fixture()
        let server = try IETFServer(directory: fixture.scratch.path)
        let file = fixture.makeFile("cli-a.bin", size: 500_000)
        _ = fixture.makeFile("cli-b.bin", size: 700_000)
        let auto = try cli(
            fixture, ["upload", "cli-a.bin", "--to", server.url("/in/"), "--protocol", "auto", "--wait", "--json"])
        #expect(auto.status == 0, "\(auto.errors)")
        let picked = try JSON.parse(auto.output).arrayValue?.first
        #expect(
            picked?["state"]?.stringValue == "completed" && picked?["upload"]?["protocol_selected"]?.stringValue == "ietf",
            "\(auto.output)")
        let pinned = try cli(
            fixture,
            [
                "upload", "cli-b.bin", "--to", server.url("/in/"), "--protocol", "ietf", "--interop-version", "5",
                "--wait", "--json",
            ])
        #expect(pinned.status == 0, "\(pinned.errors)")
        #expect(try JSON.parse(pinned.output).arrayValue?.first?["upload"]?["interop_version"]?.intValue == 5)
        #expect(requests(server, "PUT").compactMap { $0["interop_version"]?.stringValue } == ["6", "5"])
        #expect(Bytes(fixture.contents(server.directory + "/uploads/cli-a.bin")) == Bytes(fixture.contents(file)))
        let refused = try cli(
            fixture, ["upload", "cli-a.bin", "--to", server.url("/in/"), "--protocol", "ietf", "--interop-version", "4"])
        #expect(refused.status == 1 && refused.errors.contains("interop_version"), "\(refused.errors)")
    }
}
