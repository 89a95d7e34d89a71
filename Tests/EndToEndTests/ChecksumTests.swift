import BackhaulTesting
import Digest
import Foundation
import JSONCodec
import Testing

extension EndToEndTests {
    static func sha256Field(_ data: Data) -> String { "sha-256=:\(Base64Text.encode(SHA256Hasher.digest(Array(data)))):" }

    @Test("checksum sha256, raw: Repr-Digest and Content-Digest trailers match the bytes received")
    func rawChecksum() throws {
        let fixture = try Fixture()
        try fixture.session()
        let file = fixture.makeFile("a.bin", size: 3_000_001)
        let task = try fixture.daemon.waitForTask(
            try fixture.enqueue(file, extra: ["upload": ["protocol": "raw", "checksum": "sha256"]]))
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        let request = try #require(fixture.sink.requests.last)
        #expect(Bytes(request.body) == Bytes(fixture.contents(file)))
        #expect(request.headers["transfer-encoding"] == "chunked")
        #expect(request.trailers["repr-digest"] == Self.sha256Field(fixture.contents(file)))
        #expect(request.trailers["content-digest"] == Self.sha256Field(fixture.contents(file)))
        #expect(task["upload"]?["checksum"]?.stringValue == "sha256")
    }

    @Test("checksum sha256, chunked: each chunk's Content-Digest matches that chunk")
    func chunkedChecksum() throws {
        let fixture = try Fixture(sink: .resumable)
        try fixture.session()
        let file = fixture.makeFile("b.bin", size: 2_500_000)
        let id = try fixture.enqueue(
            file, path: "/b", extra: ["upload": ["protocol": "chunked", "chunk_size": 1_000_000, "checksum": "sha256"]])
        let task = try fixture.daemon.waitForTask(id)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(Bytes(fixture.sink.assembled("/b")) == Bytes(fixture.contents(file)))
        let chunks = fixture.sink.requests.filter { $0.headers["content-range"] != nil }
        #expect(chunks.count == 3)
        for chunk in chunks { #expect(chunk.trailers["content-digest"] == Self.sha256Field(chunk.body)) }
    }

    static func hex(_ data: Data) -> String { SHA256Hasher.digest(Array(data)).map { String(format: "%02x", $0) }.joined() }

    @Test("checksum sha256, multipart: a sha256 field after the file carries the file's digest")
    func multipartChecksum() throws {
        let fixture = try Fixture()
        try fixture.session()
        let file = fixture.makeFile("m.bin", size: 1_500_003)
        let id = try fixture.enqueue(
            file,
            extra: [
                "request": ["url": .string(fixture.sink.url("/forms")), "method": "POST"],
                "upload": ["protocol": "multipart", "fields": ["device": "cam-1"], "checksum": "sha256"],
            ])
        let task = try fixture.daemon.waitForTask(id)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        let request = try #require(fixture.sink.requests.last)
        let boundary = try #require(request.headers["content-type"]?.components(separatedBy: "boundary=").last)
        let parts = Multipart.parse(request.body, boundary: boundary)
        #expect(parts.map { $0.name ?? "" } == ["device", "file", "sha256"])
        #expect(Bytes(parts[1].body) == Bytes(fixture.contents(file)))
        #expect(parts[2].body == Data(Self.hex(fixture.contents(file)).utf8))
        let (status, problem) = try fixture.daemon.call(
            "POST", "/v1/sessions/s1/tasks",
            [
                "file": .string(file), "request": ["url": "http://127.0.0.1:9/x", "method": "POST"],
                "upload": ["protocol": "multipart", "fields": ["sha256": "x"], "checksum": "sha256"],
            ])
        #expect(status == 422 && problem["field"]?.stringValue == "upload.fields")
        #expect(
            try fixture.daemon.call(
                "POST", "/v1/sessions/s1/tasks",
                [
                    "file": .string(file), "request": ["url": "http://127.0.0.1:9/x"], "upload": ["checksum": "md5"],
                ]
            ).0 == 422)
    }

    @Test("checksum sha256, tus: Upload-Checksum on every PATCH; a chunk damaged on the way gets 460 and is sent again")
    func tusChecksum() throws {
        let fixture = try Fixture()
        let tus = try TusServer(directory: fixture.scratch.path, checksum: true, corruptPatch: 2)
        try fixture.session()
        let file = fixture.makeFile("clip.mp4", size: 3 * 1024 * 1024 + 11)
        let id = try fixture.enqueue(
            file,
            extra: [
                "request": ["url": .string(tus.creationURL), "method": "POST"],
                "upload": ["protocol": "tus", "chunk_size": 1_048_576, "checksum": "sha256"],
            ])
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(
            task["state"]?.stringValue == "completed", "\(task.serialized()) \(tus.requests.map { $0.serialized() })")
        #expect(
            Bytes(fixture.contents(tus.uploads.first ?? "")) == Bytes(fixture.contents(file)),
            "the damaged chunk was refused, not stored")
        let patches = tus.requests.filter { $0["method"]?.stringValue == "PATCH" }
        #expect(patches.allSatisfy { $0["upload_checksum"]?.stringValue?.hasPrefix("sha256 ") == true })
        #expect(patches.map { $0["status"]?.intValue ?? 0 } == [204, 460, 204, 204, 204])
        #expect(tus.requests.first?["method"]?.stringValue == "OPTIONS")
    }

    @Test(
        "checksum sha256, tus without the extension: plain PATCHes, and a damaged chunk goes unnoticed (why the extension matters)"
    )
    func tusWithoutChecksumExtension() throws {
        let fixture = try Fixture()
        let tus = try TusServer(directory: fixture.scratch.path, corruptPatch: 1)
        try fixture.session()
        let file = fixture.makeFile("clip.mp4", size: 1_500_000)
        let id = try fixture.enqueue(
            file,
            extra: [
                "request": ["url": .string(tus.creationURL), "method": "POST"],
                "upload": ["protocol": "tus", "chunk_size": 1_048_576, "checksum": "sha256"],
            ])
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(
            tus.requests.filter { $0["method"]?.stringValue == "PATCH" }.allSatisfy {
                $0["upload_checksum"] == .null || $0["upload_checksum"] == nil
            })
        #expect(fixture.contents(tus.uploads.first ?? "") != fixture.contents(file))
    }

    @Test("checksum sha256, s3: x-amz-checksum-sha256 on every part; a part damaged on the way gets BadDigest and is sent again")
    func s3Checksum() throws {
        let fixture = try Fixture()
        let s3 = try S3Server(directory: fixture.scratch.path, corruptPart: 2)
        try fixture.session()
        let file = fixture.makeFile("big.bin", size: 12 * 1024 * 1024 + 5)
        let id = try fixture.enqueue(
            file,
            extra: [
                "request": ["url": .string(s3.objectURL("sum/big.bin")), "method": "PUT"],
                "upload": ["protocol": "s3", "chunk_size": 5_242_880, "checksum": "sha256"], "s3": s3.taskCredentials,
            ])
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(
            task["state"]?.stringValue == "completed", "\(task.serialized()) \(s3.requests.map { $0.serialized() })")
        #expect(Bytes(s3.object("sum/big.bin")) == Bytes(fixture.contents(file)))
        let parts = s3.requests.filter { $0["query"]?.stringValue?.contains("partNumber=") == true }
        #expect(parts.count == 4, "three parts and the damaged one again: \(parts.map { $0.serialized() })")
        #expect(parts.filter { $0["injected"]?.intValue == 400 }.count == 1)
        #expect(parts.allSatisfy { ($0["checksum"]?.stringValue ?? "").count == 44 })
    }
}

/// Base64 for expected values, independent of the daemon's encoder.
enum Base64Text {
    static func encode(_ bytes: [UInt8]) -> String { Data(bytes).base64EncodedString() }
}
