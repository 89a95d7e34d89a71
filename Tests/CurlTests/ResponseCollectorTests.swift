import Testing

@testable import Curl

@Suite("Response collector")
struct ResponseCollectorTests {
    /// A collector attached to a handle, and a way to hand it header lines as libcurl does
    /// (each with its CRLF, the empty line ending a block).
    final class Fixture {
        let easy: EasyHandle
        let collector = ResponseCollector(bodyLimit: 8)

        init() throws {
            easy = try EasyHandle()
            collector.attach(to: easy)
        }

        func receive(_ lines: String...) {
            for line in lines { Array((line + "\r\n").utf8).withUnsafeBytes { easy.onHeaderLine?($0) } }
        }
    }

    @Test("after a 100 Continue: the final response's headers, as received, values without the blanks before them")
    func finalResponse() throws {
        let fixture = try Fixture()
        fixture.receive("HTTP/1.1 100 Continue", "", "HTTP/1.1 201 Created", "Location: /a", "X-Count:  1", "x-count:\t2 ")
        fixture.receive("Server:nginx", "Empty:", "not a header", "")
        let collector = fixture.collector
        #expect(collector.status == 201)
        let expected = [("Location", "/a"), ("X-Count", "1"), ("x-count", "2 "), ("Server", "nginx"), ("Empty", "")]
        #expect(collector.headers.elementsEqual(expected, by: ==))
    }

    @Test("header(_:): the last value of a name in any case, nil when absent")
    func lookup() throws {
        let fixture = try Fixture()
        fixture.receive("HTTP/1.1 200 OK", "ETag: \"1\"", "Retry-After: 5", "etag: \"2\"", "Ärger: ja", "")
        let collector = fixture.collector
        #expect(collector.header("ETAG") == "\"2\"")
        #expect(collector.header("retry-after") == "5")
        #expect(collector.header("Retry-After ") == nil)
        #expect(collector.header("Retry") == nil)
        #expect(collector.header("ärger") == "ja")
    }

    @Test("a 1xx is handed over with its own status and headers, none of which stay for the final response")
    func informational() throws {
        let fixture = try Fixture()
        var seen: [(Int, [(String, String)])] = []
        fixture.collector.onInformational = { seen.append(($0.status, $0.headers)) }
        fixture.receive("HTTP/1.1 104 Upload Resumption Supported", "Location: /r", "Upload-Draft-Interop-Version: 6", "")
        #expect(fixture.collector.status == 0)
        #expect(fixture.collector.headers.isEmpty && fixture.collector.header("location") == nil)
        fixture.receive("HTTP/1.1 200 OK", "Upload-Offset: 5", "")
        #expect(seen.count == 1)
        #expect(seen.first?.0 == 104)
        #expect(seen.first?.1.elementsEqual([("Location", "/r"), ("Upload-Draft-Interop-Version", "6")], by: ==) == true)
        #expect(fixture.collector.status == 200)
        #expect(fixture.collector.headers.elementsEqual([("Upload-Offset", "5")], by: ==))
        #expect(fixture.collector.header("location") == nil)
    }

    @Test("headers read while lines still come, then a reset: each read shows the lines so far")
    func readsBetweenLines() throws {
        let fixture = try Fixture()
        let collector = fixture.collector
        fixture.receive("HTTP/1.1 200 OK", "A: 1")
        #expect(collector.headers.elementsEqual([("A", "1")], by: ==))
        fixture.receive("B: 2")
        #expect(collector.headers.elementsEqual([("A", "1"), ("B", "2")], by: ==))
        #expect(collector.header("b") == "2")
        collector.reset()
        #expect(collector.status == 0 && collector.headers.isEmpty && collector.header("a") == nil)
        fixture.receive("HTTP/1.1 204 No Content", "C: 3", "")
        #expect(collector.headers.elementsEqual([("C", "3")], by: ==))
    }

    @Test(
        "status lines: three digits after the version, else no status",
        arguments: [
            ("HTTP/1.1 200 OK", 200), ("HTTP/2 404", 404), ("HTTP/1.1   503 Busy", 503), ("HTTP/1.1 20 OK", 0),
            ("HTTP/1.1 2000 OK", 0), ("HTTP/1.1 200OK", 0), ("HTTP/1.1", 0),
        ])
    func statusLine(_ line: String, _ status: Int) throws {
        let fixture = try Fixture()
        fixture.receive(line, "X: 1")
        #expect(fixture.collector.status == status)
        #expect(fixture.collector.header("x") == "1")
    }
}
