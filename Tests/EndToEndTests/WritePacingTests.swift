import BackhaulTesting
import Curl
import Foundation
import JSONCodec
import Testing

/// Write pacing: while many transfers run, the engine's writes (attempts ended, the next ones started)
/// wait for the next turns', together one commit, until 3 slots wait for their claims or
/// `write_pacing` passed. 160 uploads of 8-40 KiB through 16 slots to a sink that reads 400 KB/s a
/// connection: the transfers end at scattered times, most of the time with 4 or more still
/// running. With a pacing of 0.1 s the commits stay within one per 3 tasks and one per 0.1 s of
/// the run, plus the few made with fewer than 4 running (the start, the tail) and the API's (55-56
/// commits in 0.77-0.79 s, three runs); with none (what the engine did before), a turn that saw a
/// transfer end committed on its own (150-158 in 0.71-0.74 s): at least 1.3 times as many.
extension EndToEndTests {
    @Test("write pacing: while 4 or more transfers run, their ends and starts share commits (3 claims or write_pacing)")
    func writePacing() throws {
        let paced = try pacedRun(pacing: 0.1)
        #expect(paced.completed == 160)
        #expect(
            Double(paced.commits) <= 160 / 3 + paced.seconds / 0.1 + 20,
            "\(paced.commits) commits in \(paced.seconds) s with a pacing of 0.1 s")
        // Without pacing, beside it: a loaded machine makes fewer commits of the same run (a slower
        // turn sees more ends at once: 80 in 1.22 s in one make test, against 150-158 in 0.71-0.74 s
        // alone), so the control is the paced run's count, not the bound that grows with the run.
        let unpaced = try pacedRun(pacing: 0)
        #expect(unpaced.completed == 160)
        #expect(
            Double(unpaced.commits) >= 1.3 * Double(paced.commits),
            "without pacing: \(unpaced.commits) commits in \(unpaced.seconds) s; with: \(paced.commits) in \(paced.seconds) s")
    }

    private func pacedRun(pacing: Double) throws -> (commits: Int, seconds: Double, completed: Int) {
        let fixture = try Fixture(
            daemonArguments: ["--write-pacing", "\(pacing)"],
            sink: .throttle(bytesPerSecond: 400_000, then: .respond(status: 201)))
        try fixture.session("s1", ["max_connections_per_host": 16])
        let tasks: [JSON] = (0..<160).map { index in
            let file = fixture.makeFile("f\(index).bin", size: 8192 + (index * 7919) % 32768)
            return ["file": .string(file), "request": ["url": .string(fixture.sink.url("/p/\(index)")), "method": "PUT"]]
        }
        let before = try commits(fixture)
        let started = Date()
        let (status, body) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", ["tasks": .array(tasks)])
        try #require(status == 201, "\(body.serialized())")
        var counts: JSON = .null
        let done = eventually(timeout: 60, interval: 0.02) {
            counts = (try? fixture.daemon.call("GET", "/v1/sessions/s1").1["task_counts"]) ?? .null
            let ended = ["completed", "failed", "cancelled"].reduce(0) { $0 + (counts[$1]?.intValue ?? 0) }
            return ended == 160
        }
        let seconds = Date().timeIntervalSince(started)
        fixture.expectLog(done, "task counts: \(counts.serialized())")
        return (try commits(fixture) - before, seconds, Int(counts["completed"]?.intValue ?? 0))
    }

    private func commits(_ fixture: Fixture) throws -> Int {
        let exchange = try HTTPClient().send("GET", "http://127.0.0.1:\(fixture.daemon.port)/metrics")
        let samples = try PrometheusParser.parse(String(decoding: exchange.body, as: UTF8.self))
        return Int(try #require(samples["backhaul_store_commits_total{}"]))
    }
}
