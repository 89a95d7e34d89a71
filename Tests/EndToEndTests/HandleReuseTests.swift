import BackhaulTesting
import Foundation
import JSONCodec
import Testing

extension EndToEndTests {
    /// The engine hands a cleanly ended transfer's curl handle to the next one (one that sent
    /// trailers is not reused: libcurl 7.88 crashed on that). One after the other on a single
    /// connection: an upload with digest trailers, a POST with a header of its own, then a plain
    /// PUT, which must go out as if on a new handle: none of the POST's method or header, and its
    /// own body whole. (With the recycling's reset left out, the PUT goes out as a POST.)
    @Test("a reused handle carries nothing of the transfer before")
    func reusedHandleStartsClean() throws {
        let fixture = try Fixture()
        try fixture.session("s1", ["max_connections_per_host": 1])
        let digested = fixture.makeFile("digested.bin", size: 100_000)
        let first = fixture.makeFile("first.bin", size: 300_000)
        let second = fixture.makeFile("second.bin", size: 200_000)
        let digestedTask = try fixture.daemon.waitForTask(
            try fixture.enqueue(digested, path: "/digested", extra: ["upload": ["protocol": "raw", "checksum": "sha256"]]))
        fixture.expectLog(digestedTask["state"]?.stringValue == "completed", "\(digestedTask.serialized())")
        let firstID = try fixture.enqueue(
            first, path: "/first",
            extra: ["request": ["url": .string(fixture.sink.url("/first")), "method": "POST", "headers": ["X-First": "1"]]])
        let firstTask = try fixture.daemon.waitForTask(firstID)
        fixture.expectLog(firstTask["state"]?.stringValue == "completed", "\(firstTask.serialized())")
        let secondTask = try fixture.daemon.waitForTask(try fixture.enqueue(second, path: "/second"))
        fixture.expectLog(secondTask["state"]?.stringValue == "completed", "\(secondTask.serialized())")

        let sent = try #require(fixture.sink.requests.last)
        #expect(sent.path == "/second")
        #expect(sent.method == "PUT")
        #expect(sent.headers["x-first"] == nil)
        #expect(sent.headers["transfer-encoding"] == nil)
        #expect(sent.headers["content-length"] == "200000")
        #expect(sent.trailers.isEmpty)
        #expect(Bytes(sent.body) == Bytes(fixture.contents(second)))
        let before = try #require(fixture.sink.requests.first { $0.path == "/first" })
        #expect(before.method == "POST" && before.headers["x-first"] == "1")
        #expect(try #require(fixture.sink.requests.first { $0.path == "/digested" }).trailers["repr-digest"] != nil)
    }
}
