import BackhaulTesting
import Foundation
import JSON
import Testing

extension EndToEndTests {
    /// The engine hands an ended transfer's curl handle to the next one. One after the other on a
    /// single connection, a plain PUT after a POST with a header of its own and a chunked body with
    /// trailers must go out as if on a new handle: none of the first request's method, headers,
    /// encoding or trailers, and its own body whole.
    @Test("a reused handle carries nothing of the transfer before")
    func reusedHandleStartsClean() throws {
        let fixture = try Fixture()
        try fixture.session("s1", ["max_connections_per_host": 1])
        let first = fixture.makeFile("first.bin", size: 300_000)
        let second = fixture.makeFile("second.bin", size: 200_000)
        let firstID = try fixture.enqueue(
            first, path: "/first",
            extra: [
                "request": ["url": .string(fixture.sink.url("/first")), "method": "POST", "headers": ["X-First": "1"]],
                "upload": ["protocol": "raw", "checksum": "sha256"],
            ])
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
        #expect(before.method == "POST" && before.headers["x-first"] == "1" && !before.trailers.isEmpty)
    }
}
