import BackhaulTesting
import Foundation
import JSONCodec
import Testing

/// systemd's notify protocol without systemd (docs/network.md): the test is the service manager, a unix
/// datagram socket named by `NOTIFY_SOCKET`.
extension EndToEndTests {
    @Test("notify: READY=1 once listening, STATUS=, WATCHDOG=1 from the engine loop (stopping while it stalls), STOPPING=1")
    func systemdNotify() throws {
        let fixture = try Fixture()
        let notify = try NotifySocket(path: fixture.scratch.file("notify"))
        let stall = fixture.scratch.file("stall-engine")
        fixture.daemon.environment = [
            "NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "1000000", "BACKHAUL_TEST_ENGINE_STALL_FILE": stall,
        ]
        _ = fixture.daemon.terminate()
        try fixture.daemon.start()
        #expect(eventually(timeout: 5) { notify.lines.contains("READY=1") }, "\(notify.lines)")
        // READY=1 comes once the API listens: the daemon answers by then.
        #expect(try fixture.daemon.call("GET", "/readyz").0 == 200)
        #expect(eventually(timeout: 5) { notify.times(of: "WATCHDOG=1").count >= 4 }, "\(notify.lines)")
        #expect(
            eventually(timeout: 5) {
                notify.lines.contains { $0.hasPrefix("STATUS=running 0, queued 0, network wired") }
            }, "\(notify.lines)")
        // The status systemd shows is the engine's, not a line the readiness left over it.
        #expect(
            eventually(timeout: 5) { notify.lines.last { $0.hasPrefix("STATUS=") }?.hasPrefix("STATUS=running") == true },
            "\(notify.lines)")
        // Half of WATCHDOG_USEC apart, give or take a loop turn.
        let beats = notify.times(of: "WATCHDOG=1")
        let gaps = zip(beats.dropFirst(), beats).map { $0 - $1 }
        #expect(gaps.allSatisfy { $0 > 0.3 && $0 < 1.0 }, "keep-alive gaps: \(gaps)")

        // The engine's loop stalls for 3 s: the keep-alives stop meanwhile, and come back after.
        let before = notify.times(of: "WATCHDOG=1").count
        let stalledAt = ProcessInfo.processInfo.systemUptime
        try "3".write(toFile: stall, atomically: true, encoding: .utf8)
        #expect(eventually(timeout: 5) { !FileManager.default.fileExists(atPath: stall) })
        #expect(eventually(timeout: 10) { notify.times(of: "WATCHDOG=1").count >= before + 3 })
        let around = notify.times(of: "WATCHDOG=1").filter { $0 >= stalledAt - 1 }
        let longest = zip(around.dropFirst(), around).map { $0 - $1 }.max() ?? 0
        #expect(longest >= 2.5 && longest < 4.5, "the longest silence around the stall: \(longest) s")
        // The API is not the engine: it answers while the loop is stalled (checked above by readyz
        // before; here the silence is the engine's alone).
        print("notify: the watchdog went silent for \(String(format: "%.2f", longest)) s while the engine loop stalled 3 s")

        #expect(fixture.daemon.terminate() == 0)
        #expect(notify.lines.contains("STOPPING=1"), "\(notify.lines)")
        let stopping = try #require(notify.messages.firstIndex { $0.lines.contains("STOPPING=1") })
        let ready = try #require(notify.messages.firstIndex { $0.lines.contains("READY=1") })
        #expect(ready < stopping)
    }
}
