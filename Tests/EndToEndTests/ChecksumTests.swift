import BackhaulTesting
import Digest
import Foundation
import JSON
import Testing

extension EndToEndTests {
    static func sha256Field(_ data: Data) -> String { "sha-256=:\(Base64Text.encode(SHA256Hasher.digest(Array(data)))):" }

    @Test("checksum sha256, raw: Repr-Digest and Content-Digest trailers match the bytes received")
    func rawChecksum() throws {
        let fixture = try Fixture()
        try fixture.session()
        let file = fixture.makeFile("a.bin", size: 3_000_001)
        let task = try fixture.daemon.waitForTask(try fixture.enqueue(file, extra: ["upload": ["protocol": "raw", "checksum": "sha256"]]))
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        let request = try #require(fixture.sink.requests.last)
        #expect(request.body == fixture.contents(file))
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
        let id = try fixture.enqueue(file, path: "/b", extra: ["upload": ["protocol": "chunked", "chunk_size": 1_000_000, "checksum": "sha256"]])
        let task = try fixture.daemon.waitForTask(id)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(fixture.sink.assembled("/b") == fixture.contents(file))
        let chunks = fixture.sink.requests.filter { $0.headers["content-range"] != nil }
        #expect(chunks.count == 3)
        for chunk in chunks { #expect(chunk.trailers["content-digest"] == Self.sha256Field(chunk.body)) }
    }

    @Test("checksum is refused where this version cannot send it")
    func checksumRefused() throws {
        let fixture = try Fixture()
        try fixture.session()
        let file = fixture.makeFile("c.bin", size: 10)
        let (status, problem) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", [
            "file": .string(file), "request": ["url": "http://127.0.0.1:9/files", "method": "POST"],
            "upload": ["protocol": "tus", "checksum": "sha256"],
        ])
        #expect(status == 422)
        #expect(problem["field"]?.stringValue == "upload.checksum")
        #expect(try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", [
            "file": .string(file), "request": ["url": "http://127.0.0.1:9/x"], "upload": ["checksum": "md5"],
        ]).0 == 422)
    }
}

/// Base64 for expected values, independent of the daemon's encoder.
enum Base64Text {
    static func encode(_ bytes: [UInt8]) -> String { Data(bytes).base64EncodedString() }
}
