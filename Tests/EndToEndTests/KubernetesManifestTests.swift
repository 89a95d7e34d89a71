import BackhaulTesting
import Foundation
import Testing

/// The manifests in Deploy/kubernetes/ held to the daemon that is built: its variables (from
/// `backhauld --help`), its probe endpoints, its listen port, its token rule and the shared roots'
/// volumes (Tests/peers/check_manifests.py says what is checked).
@Suite("Kubernetes manifests")
struct KubernetesManifestTests {
    static var manifests: URL { EndToEndTests.repository.appendingPathComponent("Deploy/kubernetes") }

    /// The checker's exit status and what it printed.
    static func check(_ paths: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", PythonPeer.script("check_manifests.py"), "--daemon", DaemonProcess.binary] + paths
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, text)
    }

    @Test("Deploy/kubernetes/: every manifest uses the daemon's variables, endpoints and port")
    func manifestsMatchTheDaemon() throws {
        let result = try Self.check([Self.manifests.path])
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output.contains("checked "), "\(result.output)")
    }

    @Test("A misspelt variable in a copy of fleet.yaml fails the check, naming it")
    func misspeltVariableFails() throws {
        let scratch = TemporaryDirectory("backhaul-manifests")
        let fleet = try String(contentsOf: Self.manifests.appendingPathComponent("fleet.yaml"), encoding: .utf8)
        #expect(fleet.contains("BACKHAUL_SHARED_ROOTS"))
        let broken = scratch.file("fleet.yaml")
        try fleet.replacingOccurrences(of: "BACKHAUL_SHARED_ROOTS", with: "BACKHAUL_SHARD_ROOTS")
            .write(toFile: broken, atomically: true, encoding: .utf8)
        let result = try Self.check([broken])
        #expect(result.status == 1, "\(result.output)")
        #expect(result.output.contains("BACKHAUL_SHARD_ROOTS is not a variable of backhauld"), "\(result.output)")
    }
}
