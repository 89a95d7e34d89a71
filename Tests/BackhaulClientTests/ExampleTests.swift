import BackhaulClient
import BackhaulTesting
import Foundation
import Testing

@Suite("docs/client.md's example: the doc shows the built file, and it uploads through a real daemon")
struct ExampleTests {
    /// The repository's root, from this file's path.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test("the Swift block of docs/client.md's example is Examples/ClientExample/main.swift, byte for byte")
    func docMatchesSource() throws {
        let doc = try String(contentsOf: Self.root.appendingPathComponent("docs/client.md"), encoding: .utf8)
        let source = try String(
            contentsOf: Self.root.appendingPathComponent("Examples/ClientExample/main.swift"), encoding: .utf8)
        let section = try #require(doc.range(of: "## An example"))
        let start = try #require(doc.range(of: "```swift\n", range: section.upperBound..<doc.endIndex))
        let end = try #require(doc.range(of: "\n```\n", range: start.upperBound..<doc.endIndex))
        #expect(String(doc[start.upperBound..<end.lowerBound]) + "\n" == source)
    }

    /// Runs the built example; its exit status and what it printed.
    func runExample(_ arguments: [String], daemon: String) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: DaemonProcess.binary).deletingLastPathComponent()
            .appendingPathComponent("backhaul-client-example")
        process.arguments = arguments
        process.environment = ["BACKHAUL_URL": daemon]
        // Its output goes to a file, read once it has ended: a hang fails the test after 60 s
        // instead of blocking it.
        let outputPath = NSTemporaryDirectory() + "backhaul-example-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).out"
        _ = FileManager.default.createFile(atPath: outputPath, contents: nil)
        defer { try? FileManager.default.removeItem(atPath: outputPath) }
        let output = try FileHandle(forWritingTo: URL(fileURLWithPath: outputPath))
        defer { try? output.close() }
        process.standardOutput = output
        try process.run()
        let ended = eventually(timeout: 60) { !process.isRunning }
        if !ended { process.terminate() }
        process.waitUntilExit()
        #expect(ended, "the example did not end within 60 s")
        return (process.terminationStatus, (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "")
    }

    @Test("the example uploads a file in chunks and sees it complete on the event stream")
    func exampleRuns() throws {
        let live = try LiveDaemon(sink: .resumable)
        let file = live.makeFile("clip.bin", size: 3_500_000)
        let (status, output) = try runExample([file, live.sink.url("/clips/clip.bin")], daemon: live.daemon.url)
        #expect(status == 0, "\(output)\n\(live.daemon.log())")
        #expect(output.contains("enqueued tsk_") && output.contains("completed: 3500000 bytes sent"), "\(output)")
        #expect(live.sink.assembled("/clips/clip.bin") == FileManager.default.contents(atPath: file))
        // Four chunks of 1 MiB: the example asked for chunked uploads.
        #expect(live.sink.requests.filter { $0.method == "PUT" }.count == 4)
    }

    @Test("a refused upload: the example prints the problem and exits 1")
    func exampleRefused() throws {
        let live = try LiveDaemon()
        let (status, output) = try runExample(["/etc/passwd", live.sink.url("/x")], daemon: live.daemon.url)
        #expect(status == 1 && output.contains("(file_outside_allowed_roots)"), "\(output)")
    }
}
