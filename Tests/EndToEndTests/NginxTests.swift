import BackhaulTesting
import Foundation
import JSONCodec
import Testing

extension EndToEndTests {
    @Test("raw uploads to nginx (WebDAV PUT) arrive byte-exact over reused connections")
    func nginxUploads() throws {
        let fixture = try Fixture()
        let nginx = try NginxServer(directory: fixture.scratch.file("nginx"))
        try fixture.session()
        var ids: [String: String] = [:]
        ids["big.bin"] = try fixture.enqueue(
            fixture.makeFile("big.bin", size: 24 << 20),
            extra: [
                "request": ["url": .string(nginx.url("/in/big.bin"))]
            ])
        for index in 0..<20 {
            let name = "small-\(index).bin"
            ids[name] = try fixture.enqueue(
                fixture.makeFile(name, size: 50_000 + index),
                extra: [
                    "request": ["url": .string(nginx.url("/in/\(name)"))]
                ])
        }
        for (name, id) in ids {
            let task = try fixture.daemon.waitForTask(id, timeout: 60)
            fixture.expectLog(task["state"]?.stringValue == "completed", "\(name): \(task.serialized())")
            #expect(task["response"]?["status"]?.intValue == 201)
            #expect(
                Bytes(fixture.contents(nginx.root + "/in/" + name)) == Bytes(fixture.contents(fixture.data + "/" + name)),
                "\(name)")
        }
    }
}

extension EndToEndTests {
    @Test("small https uploads started together to an HTTP/2 server share one multiplexed connection")
    func nginxHTTP2Multiplexing() throws {
        let lines = try httpsBurst(http2: true)
        #expect(lines.allSatisfy { $0[1] == "HTTP/2.0" }, "\(lines)")
        #expect(Set(lines.map { $0[0] }).count == 1, "connections: \(lines.map { $0[0] })")
    }

    @Test("the same burst to an https server that speaks only HTTP/1.1 is not held to one connection")
    func nginxHTTPSBurstHTTP1() throws {
        let lines = try httpsBurst(http2: false)
        #expect(lines.allSatisfy { $0[1] == "HTTP/1.1" }, "\(lines)")
        #expect(Set(lines.map { $0[0] }).count > 1, "connections: \(lines.map { $0[0] })")
    }

    @Test("300 small https uploads reuse their connections: no more handshakes than transfers at once")
    func nginxHTTPSConnectionReuse() throws {
        let lines = try httpsBurst(http2: false, count: 300, perHost: 8)
        let connections = Set(lines.map { $0[0] })
        #expect(connections.count <= 8, "\(connections.count) connections for \(lines.count) requests")
    }

    /// `count` small uploads in one batch (the first `perHost` start together, before any
    /// connection has said whether it speaks HTTP/2) to nginx over https; each arrives byte-exact. Returns nginx's
    /// log of them: connection, protocol, method, path, status.
    private func httpsBurst(http2: Bool, count: Int = 24, perHost: Int = 16) throws -> [[Substring]] {
        let scratch = TemporaryDirectory("backhaul-https")
        let certificate = try SelfSignedCertificate(directory: scratch.path)
        let nginx = try NginxServer(directory: scratch.file("nginx"), tls: certificate, http2: http2)
        let fixture = try Fixture(daemonArguments: ["--ca-bundle", certificate.certificate])
        try fixture.session("s1", ["max_connections_per_host": .int(Int64(perHost))])
        let names = (0..<count).map { "small-\($0).bin" }
        let tasks: [JSON] = names.enumerated().map { index, name in
            [
                "file": .string(fixture.makeFile(name, size: 20_000 + index % 24 * 1_000)),
                "request": ["url": .string(nginx.tlsURL("/burst/\(name)")), "method": "PUT"],
            ]
        }
        let (status, body) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", ["tasks": .array(tasks)])
        try #require(status == 201, "\(body.serialized().prefix(300))")
        let ids = try #require(body["tasks"]?.arrayValue?.compactMap { $0["id"]?.stringValue })
        try #require(ids.count == names.count)
        for (name, id) in zip(names, ids) {
            let task = try fixture.daemon.waitForTask(id, timeout: 60)
            fixture.expectLog(task["state"]?.stringValue == "completed", "\(name): \(task.serialized())")
            #expect(
                Bytes(fixture.contents(nginx.root + "/burst/" + name)) == Bytes(fixture.contents(fixture.data + "/" + name)),
                "\(name)")
        }
        // nginx logs a request once it has answered it.
        var lines: [[Substring]] = []
        _ = eventually(timeout: 10) {
            lines = ((try? String(contentsOfFile: nginx.tlsAccessLog, encoding: .utf8)) ?? "")
                .split(separator: "\n").map { $0.split(separator: " ") }
            return lines.count >= names.count
        }
        try #require(lines.count == names.count && lines.allSatisfy { $0.count == 5 }, "\(lines)")
        #expect(lines.allSatisfy { $0[2] == "PUT" && $0[4] == "201" }, "\(lines)")
        return lines
    }
}
