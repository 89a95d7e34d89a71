import BackhaulTesting
import Foundation
import JSONCodec
import Testing

/// One test's world: a scratch directory with files to upload, a recording sink, a daemon.
final class Fixture {
    let scratch = TemporaryDirectory("backhaul-e2e")
    let data: String
    let sink: RecordingSink
    let daemon: DaemonProcess

    init(
        daemonArguments: [String] = [], sink fallback: RecordingSink.Behaviour = .respond(status: 201, body: "{\"ok\":true}"),
        environment: [String: String] = [:]
    ) throws {
        data = scratch.file("data")
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        sink = try RecordingSink(directory: scratch.file("sink"), fallback: fallback)
        daemon = try DaemonProcess(
            stateDirectory: scratch.file("state"), allowedRoot: data, arguments: daemonArguments, environment: environment)
    }

    @discardableResult
    func makeFile(_ name: String, size: Int) -> String { scratch.makeFile("data/\(name)", size: size) }

    func contents(_ path: String) -> Data { FileManager.default.contents(atPath: path) ?? Data() }

    @discardableResult
    func session(_ id: String = "s1", _ configuration: JSON = [:]) throws -> JSON {
        let (status, body) = try daemon.call("PUT", "/v1/sessions/\(id)", ["configuration": configuration])
        #expect(status == 201 || status == 200, "PUT session: \(body.serialized())")
        return body
    }

    /// Enqueues one upload and returns its id.
    func enqueue(_ file: String, path: String = "/upload", session: String = "s1", extra: JSONObject = [:]) throws -> String {
        var object: JSONObject = ["file": .string(file), "request": ["url": .string(sink.url(path)), "method": "PUT"]]
        for (key, value) in extra { object[key] = value }
        let (status, body) = try daemon.call("POST", "/v1/sessions/\(session)/tasks", .object(object))
        try #require(status == 201, "enqueue: \(status) \(body.serialized())")
        return try #require(body["id"]?.stringValue)
    }

    /// Fails the test with the daemon's log when `condition` is false.
    func expectLog(_ condition: Bool, _ comment: String) {
        #expect(condition, Comment(rawValue: comment + "\n--- daemon log ---\n" + daemon.log()))
    }
}

/// Fast retries for tests: the schedule's shape is tested in the unit tests.
let quickRetry: JSON = ["retry": ["initial_backoff": 0.05, "max_backoff": 0.2]]
