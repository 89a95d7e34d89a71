import BackhaulTesting
import Foundation
import JSONCodec
import Testing

/// docs/credentials.md: the engine never waits on a peer. Each source of the AWS chain that
/// hangs (a `credential_process` that sleeps, a container endpoint and an IMDS that take the
/// connection and never answer) is one daemon, and each daemon meets every other hang at once: a
/// signer that never answers, 50 webhook receivers that never answer, and a destination whose
/// name does not resolve. Meanwhile 10 small raw tasks of another session complete within a
/// second, and the watchdog keeps receiving `WATCHDOG=1` from the engine's loop.
extension EndToEndTests {
    @Test(
        "the engine never waits: hanging credential sources, signer, 50 webhook receivers and an unresolvable name; 10 raw tasks complete within a second",
        arguments: ["credential_process", "container", "imds"])
    func engineNeverWaits(_ source: String) throws {
        let scratch = TemporaryDirectory("backhaul-never-waits")
        let hanging = try HangingPeer()
        let notify = try NotifySocket(path: scratch.file("notify"))
        let config = scratch.file("config")
        try "[default]\ncredential_process = sleep 120\n".write(toFile: config, atomically: true, encoding: .utf8)
        var variables = ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "1000000"]
        var arguments = fastWebhookRetries
        switch source {
        case "credential_process":
            variables["AWS_CONFIG_FILE"] = config
        case "container":
            variables["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = hanging.url("/credentials")
        default:
            variables["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = hanging.url("")
            arguments += ["--aws-imds"]
        }
        let fixture = try Fixture(daemonArguments: arguments, environment: chainEnvironment(scratch, variables))
        #expect(eventually(timeout: 10) { notify.lines.contains("READY=1") }, "\(notify.lines)")

        // s1: four s3 tasks whose keys come from the hanging source; 50 webhook receivers that
        // never answer hear of them.
        try fixture.session("s1")
        for index in 0..<50 { try fixture.subscribe(hanging.url("/hook/\(index)")) }
        var waiting: [String] = []
        for index in 0..<4 {
            waiting.append(
                try enqueueS3FromChain(
                    fixture, url: fixture.sink.url("/bucket/s3-\(index)"),
                    file: fixture.makeFile("s3-\(index).bin", size: 64 * 1024)))
        }
        // signed: a signer that never answers.
        try fixture.session("signed", ["signer": ["url": .string(hanging.url("/sign"))]])
        var others: [String] = []
        for index in 0..<2 {
            others.append(try fixture.enqueue(fixture.makeFile("signed-\(index).bin", size: 1024), session: "signed"))
        }
        // far: a destination whose name does not resolve, 50 more receivers that never answer.
        try fixture.session("far", quickRetry)
        for index in 0..<50 { try fixture.subscribe(hanging.url("/far-hook/\(index)"), session: "far") }
        others.append(
            try fixture.enqueue(
                fixture.makeFile("far.bin", size: 1024), session: "far",
                extra: ["request": ["url": "http://backhaul-never-resolves.invalid/upload", "method": "PUT"]]))
        // The reason names the source the chain asks.
        let reason = "aws_credentials_" + (source == "credential_process" ? "process" : source)
        let reasons = eventually(timeout: 10) {
            waiting.allSatisfy { (try? fixture.daemon.task($0))?["waiting_reason"]?.stringValue == reason }
        }
        let shown = waiting.compactMap { try? fixture.daemon.task($0).serialized() }
        fixture.expectLog(reasons, "the s3 tasks wait for their keys: \(shown)")
        Thread.sleep(forTimeInterval: 1)

        // raw: 10 small tasks of another session, timed from the first POST to the last completion.
        try fixture.session("raw")
        let beatsBefore = notify.times(of: "WATCHDOG=1").count
        let started = Date()
        var raw: [String] = []
        for index in 0..<10 { raw.append(try fixture.enqueue(fixture.makeFile("raw-\(index).bin", size: 4096), session: "raw")) }
        let completed = eventually(timeout: 90, interval: 0.01) {
            raw.allSatisfy { (try? fixture.daemon.task($0))?["state"]?.stringValue == "completed" }
        }
        let seconds = Date().timeIntervalSince(started)
        print("engine never waits (\(source)): 10 raw tasks completed in \(String(format: "%.3f", seconds)) s")
        fixture.expectLog(completed && seconds < 1, "10 raw tasks took \(seconds) s")

        // The watchdog went on from the engine's loop: half of WATCHDOG_USEC apart, give or take.
        Thread.sleep(forTimeInterval: 2)
        let beats = notify.times(of: "WATCHDOG=1")
        let gaps = zip(beats.dropFirst(), beats).map { $0 - $1 }
        #expect(beats.count >= beatsBefore + 3 && gaps.allSatisfy { $0 < 1.0 }, "keep-alive gaps: \(gaps)")

        // Nothing else waits for credentials; the s3 tasks still do, and nothing reached the sink for them.
        for id in others + raw {
            #expect((try fixture.daemon.task(id))["waiting_reason"]?.stringValue?.hasPrefix("aws_credentials") != true)
        }
        for id in waiting {
            #expect((try fixture.daemon.task(id))["waiting_reason"]?.stringValue == reason)
        }
        #expect(!fixture.sink.requests.contains { $0.path.hasPrefix("/bucket/") })
        let status = fixture.daemon.terminate()
        fixture.expectLog(status == 0, "SIGTERM: \(status.map(String.init) ?? "still running")")
    }
}
