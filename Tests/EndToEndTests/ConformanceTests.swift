import BackhaulTesting
import Foundation
import Testing

extension EndToEndTests {
    /// schemathesis generates requests from OpenAPI/backhaul.yaml (valid and invalid) against the
    /// live daemon and checks every answer: no 5xx, every response matches its schema, invalid
    /// input is refused. `/v1/events` is left out: its stream does not end. Rules that span
    /// several members (documented in the OpenAPI description) make `positive_data_acceptance`
    /// meaningless, so that one check is off.
    @Test("schemathesis: generated requests find no server error and no schema violation")
    func schemathesisConformance() throws {
        let fixture = try Fixture()
        let spec = URL(fileURLWithPath: PythonPeer.script("")).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("OpenAPI/backhaul.yaml").path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [
            "python3", "-m", "schemathesis.cli", "run", spec, "--url", "http://127.0.0.1:\(fixture.daemon.port)",
            "--max-examples", "30", "--exclude-path", "/v1/events",
            "--exclude-checks", "positive_data_acceptance", "--seed", "1",
        ]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        process.environment = ProcessInfo.processInfo.environment.merging(["NO_COLOR": "1"]) { $1 }
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let summary = text.split(separator: "\n").filter { $0.contains("generated") }.joined(separator: " ")
        print("schemathesis: \(summary)")
        #expect(process.terminationStatus == 0, "\(text.suffix(6000))")
        #expect(fixture.daemon.isRunning, "the daemon survived the fuzzing")
    }
}
