import BackhaulTesting
import Foundation
import JSONCodec
import Testing

extension EndToEndTests {
    func enqueueChunked(_ fixture: Fixture, file: String, path: String, chunk: Int) throws -> String {
        try fixture.enqueue(file, path: path, extra: ["upload": ["protocol": "chunked", "chunk_size": .int(Int64(chunk))]])
    }

    @Test("chunked: Content-Range pieces assemble byte-exact at a resumable server")
    func chunkedUpload() throws {
        let fixture = try Fixture(sink: .resumable)
        try fixture.session()
        let file = fixture.makeFile("video.bin", size: 5 * 1024 * 1024 + 123)
        let task = try fixture.daemon.waitForTask(try enqueueChunked(fixture, file: file, path: "/v", chunk: 1 << 20))
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(Bytes(fixture.sink.assembled("/v")) == Bytes(fixture.contents(file)))
        let ranges = fixture.sink.requests.compactMap { $0.headers["content-range"] }
        #expect(ranges.count == 6)
        #expect(ranges.first == "bytes 0-1048575/5243003")
        #expect(ranges.last == "bytes 5242880-5243002/5243003")
        #expect(task["upload"]?["chunk_size"]?.intValue == 1 << 20)
    }

    @Test("chunked: a fault on one chunk re-sends only that chunk")
    func chunkedFaultResendsOneChunk() throws {
        let fixture = try Fixture(sink: .resumable)
        try fixture.session("s1", quickRetry)
        fixture.sink.enqueue(.passThrough, .passThrough, .respond(status: 503))
        let size = 4 * 1024 * 1024
        let file = fixture.makeFile("a.bin", size: size)
        let task = try fixture.daemon.waitForTask(try enqueueChunked(fixture, file: file, path: "/a", chunk: 1 << 20))
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(Bytes(fixture.sink.assembled("/a")) == Bytes(fixture.contents(file)))
        let ranges = fixture.sink.requests.compactMap { $0.headers["content-range"] }
        // Two chunks, the failed third, the resume query, then the third again and the fourth.
        #expect(
            ranges == [
                "bytes 0-1048575/4194304", "bytes 1048576-2097151/4194304", "bytes 2097152-3145727/4194304",
                "bytes */4194304", "bytes 2097152-3145727/4194304", "bytes 3145728-4194303/4194304",
            ])
        #expect(task["attempts"]?.intValue == 2)
    }

    @Test("chunked: SIGKILL mid-upload, restart: resumes from the server's offset, under 1.5× the file sent")
    func chunkedSurvivesSigkill() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 3_000_000, then: .resumable))
        try fixture.session()
        let size = 12 * 1024 * 1024
        let file = fixture.makeFile("big.bin", size: size)
        let id = try enqueueChunked(fixture, file: file, path: "/big", chunk: 1 << 20)
        try #require(eventually(timeout: 20) { fixture.sink.requests.filter { $0.status == 308 }.count >= 4 })
        fixture.daemon.kill9()
        try fixture.daemon.start()
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(Bytes(fixture.sink.assembled("/big")) == Bytes(fixture.contents(file)))
        let sent = fixture.sink.totalBodyBytes
        #expect(Double(sent) < 1.5 * Double(size), "sent \(sent) for \(size)")
        #expect(
            fixture.sink.requests.contains { $0.headers["content-range"] == "bytes */\(size)" }, "asked the server where it was")
        print("chunked SIGKILL: \(sent - Int64(size)) bytes re-sent for a \(size)-byte file")
    }
}
