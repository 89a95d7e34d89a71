import BackhaulTesting
import Foundation
import Testing

/// Issue 48's lab (scripts/benchlib/lab.py): a 40 Mbit bottleneck with about 300 ms of queue in
/// network namespaces, a sink and a TCP echo beyond it. The lab runs every phase against this
/// build's daemon, beside a plain `curl -T`, and prints its figures as JSON; this test holds them
/// to the targets with some slack for a loaded machine (`make bench`'s background section holds
/// the release build to the targets themselves). It needs root: elsewhere it says loudly that it
/// did not run.
@Suite("Background lab", .serialized, .timeLimit(.minutes(3)))
struct BackgroundLabTests {
    @Test("a background upload uses the idle link, keeps the queue short and yields to a foreground flow")
    func lab() throws {
        guard geteuid() == 0 else {
            print("BACKGROUND LAB SKIPPED: it needs root (ip netns, tc); run make test as root")
            return
        }
        let scripts = URL(fileURLWithPath: PythonPeer.script("")).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("scripts").path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-m", "benchlib.lab", "--binary", DaemonProcess.binary, "--seconds", "4"]
        process.currentDirectoryURL = URL(fileURLWithPath: scripts)
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        // The lab bounds its own phases (about 45 s); past 150 s it is stopped.
        let watchdog = DispatchWorkItem { process.terminate() }
        DispatchQueue.global().asyncAfter(deadline: .now() + 150, execute: watchdog)
        let text = output.fileHandleForReading.readDataToEndOfFile()
        let log = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        watchdog.cancel()
        try #require(process.terminationStatus == 0, "the lab failed: \(log.suffix(4000))")
        let figures = try #require(try JSONSerialization.jsonObject(with: text) as? [String: Any])
        print("background lab: \(String(decoding: text, as: UTF8.self))")
        func figure(_ phase: String, _ key: String) -> Double { ((figures[phase] as? [String: Any])?[key] as? Double) ?? .nan }
        let link = figures["link_bytes_per_second"] as? Double ?? 5_000_000
        let idle = figure("idle", "p50_ms")
        // The targets, with slack for a machine shared by several builds.
        #expect(figure("background_alone", "bytes_per_second") >= 0.7 * link, "background alone: ≥ 80 % of the link")
        #expect(figure("background_alone", "p50_ms") <= idle + 35, "probe p50: ≤ idle + 25 ms")
        #expect(figure("background_alone", "p95_ms") <= idle + 80, "probe p95: ≤ idle + 60 ms")
        #expect(
            figure("foreground_beside_background", "bytes_per_second") >= 0.7 * figure("curl_alone", "bytes_per_second"),
            "a foreground flow keeps ≥ 80 % of its rate")
        let recovery = figures["recovery_s"] as? Double
        #expect(recovery != nil && recovery! <= 7, "back at 70 % of the link within 5 s")
        #expect(figure("default_alone", "bytes_per_second") >= 0.8 * link, "default alone: ≥ 85 % of the link")
        // The control: the same upload without background priority queues the probe past the
        // background's p95 bound, so the bounds above tell a yielding upload from one that does not
        // (181-192 ms p50 in four make test runs). Plain curl's figure is printed beside it, not held:
        // under make test's load its window filled 76-213 ms of the queue from run to run.
        #expect(figure("default_alone", "p50_ms") > idle + 80, "an upload that does not yield fills the queue")
        // The task says it is yielding.
        let shown = (figures["background_alone"] as? [String: Any])?["progress_background"] as? [String: Any]
        #expect((shown?["rate_bytes_per_second"] as? Double ?? 0) > 0)
        // And the metrics.
        let metrics = (figures["background_alone"] as? [String: Any])?["metrics"] as? [String: Any]
        #expect((metrics?["backhaul_background_rate_bytes"] as? Double ?? 0) > 0)
        #expect(metrics?["backhaul_queue_delay_seconds"] != nil)
    }
}
