import BackhaulTesting
import Foundation
import JSONCodec
import Testing

extension EndToEndTests {
    static var repository: URL {
        URL(fileURLWithPath: PythonPeer.script("")).deletingLastPathComponent().deletingLastPathComponent()
    }

    @Test("Deploy/: the example config starts the daemon as written, and the Dockerfiles pass hadolint")
    func deployFiles() throws {
        let fixture = try Fixture(daemonArguments: [
            "--config", Self.repository.appendingPathComponent("Deploy/backhauld.json").path,
        ])
        let info = try fixture.daemon.call("GET", "/v1/info").1
        #expect(info["upload_hosts"]?.arrayValue?.count == 2 && info["shutdown_grace"]?.doubleValue == 20)
        let policy = try fixture.daemon.call("GET", "/v1/policy").1
        #expect(policy["discretionary_window"]?["from"]?.stringValue == "22:00")
        #expect(policy["bandwidth_limit_by_network"]?["cellular"]?.intValue == 1_048_576)

        let lint = Process()
        lint.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        lint.arguments =
            ["hadolint"]
            + ["Deploy/Dockerfile", "Deploy/test/swift-builder.Dockerfile"].map {
                Self.repository.appendingPathComponent($0).path
            }
        let output = Pipe()
        lint.standardOutput = output
        lint.standardError = output
        try lint.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        lint.waitUntilExit()
        #expect(lint.terminationStatus == 0, "\(text)")
    }
}
