import BackhaulCLI
import BackhaulCore
import BackhaulTesting
import Curl
import Foundation
import JSONCodec
import Testing

extension EndToEndTests {
    /// Runs the `backhaul` binary (beside the test bundle) against the fixture's daemon.
    func cli(_ fixture: Fixture, _ arguments: [String], url: String? = nil) throws -> (
        status: Int32, output: String, errors: String
    ) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: DaemonProcess.binary).deletingLastPathComponent().appendingPathComponent(
            "backhaul")
        process.arguments = arguments
        process.environment = ["BACKHAUL_URL": url ?? "http://127.0.0.1:\(fixture.daemon.port)", "PATH": "/usr/bin:/bin"]
        process.currentDirectoryURL = URL(fileURLWithPath: fixture.data)
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let out = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let err = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, out, err)
    }

    @Test("one version: backhaul --version, backhauld --version and GET /v1/info agree")
    func oneVersion() throws {
        let fixture = try Fixture()
        let (status, output, _) = try cli(fixture, ["--version"])
        #expect(status == 0 && output.trimmingCharacters(in: .whitespacesAndNewlines) == "backhaul \(BackhaulVersion.string)")
        let daemon = Process()
        daemon.executableURL = URL(fileURLWithPath: DaemonProcess.binary)
        daemon.arguments = ["--version"]
        let pipe = Pipe()
        daemon.standardOutput = pipe
        try daemon.run()
        let printed = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        daemon.waitUntilExit()
        #expect(printed.trimmingCharacters(in: .whitespacesAndNewlines) == "backhauld \(BackhaulVersion.string)")
        #expect(try fixture.daemon.call("GET", "/v1/info").1["version"]?.stringValue == BackhaulVersion.string)
    }

    /// OpenAPI/backhaul.yaml in the CLI: `ls` marks a task whose latest attempt failed, `show` prints the
    /// error and the attempt history.
    @Test("cli: ls marks a retrying task with its last error; show prints it and the attempts")
    func commandLineFailures() throws {
        let fixture = try Fixture()
        try fixture.session("cli", ["retry": ["initial_backoff": 30, "max_backoff": 30]])
        let file = fixture.makeFile("clip.bin", size: 1000)
        let id = try fixture.enqueue(
            file, session: "cli", extra: ["request": ["url": .string("http://127.0.0.1:\(try freePort())/x")]])
        _ = try fixture.daemon.waitForTask(id, state: "retrying")
        let listed = try cli(fixture, ["ls", "--session", "cli"])
        #expect(listed.output.contains("retrying ! cannot_connect_to_host"), "\(listed.output)")
        let shown = try cli(fixture, ["show", id])
        #expect(shown.output.contains("last error: -1004 cannot_connect_to_host"), "\(shown.output)")
        #expect(shown.output.contains("attempts, newest first:") && shown.output.contains("retry"), "\(shown.output)")
    }

    @Test(
        "cli: upload --wait, ls, show, sessions, info, network and webhooks, with tables and --json; exit codes scripts rely on")
    func commandLine() throws {
        let fixture = try Fixture()
        let first = fixture.makeFile("clip-1.bin", size: 200_000)
        _ = fixture.makeFile("clip-2.bin", size: 300_000)
        let upload = try cli(
            fixture, ["upload", "clip-1.bin", "clip-2.bin", "--to", fixture.sink.url("/in/"), "--wait", "--json"])
        #expect(upload.status == 0, "\(upload.errors)")
        let tasks = try JSON.parse(upload.output).arrayValue ?? []
        #expect(tasks.count == 2 && tasks.allSatisfy { $0["state"]?.stringValue == "completed" })
        #expect(fixture.sink.requests.map(\.path).sorted() == ["/in/clip-1.bin", "/in/clip-2.bin"])
        #expect(Bytes(fixture.sink.requests.first { $0.path == "/in/clip-1.bin" }?.body) == Bytes(fixture.contents(first)))

        let listed = try cli(fixture, ["ls", "--session", "cli"])
        #expect(
            listed.status == 0 && listed.output.hasPrefix("ID") && listed.output.contains("completed")
                && listed.output.contains("100%"))
        let id = tasks[0]["id"]?.stringValue ?? ""
        let shown = try cli(fixture, ["show", id])
        #expect(
            shown.output.contains("state:      completed") && shown.output.contains("response:   HTTP 201"), "\(shown.output)")
        #expect(shown.output.contains("attempts, newest first:") && shown.output.contains("completed"), "\(shown.output)")
        let sessions = try cli(fixture, ["sessions"])
        #expect(sessions.output.contains("cli"), "exit \(sessions.status): \(sessions.output) \(sessions.errors)")
        let info = try cli(fixture, ["info"])
        #expect(info.status == 0 && info.output.contains("version") && info.output.contains("allowed_roots"), "\(info.output)")
        #expect(info.output.contains("finished_task_retention    604800.0"), "\(info.output)")
        #expect((try JSON.parse(cli(fixture, ["info", "--json"]).output))["task_counts"]?["completed"]?.intValue == 2)

        // The network: override, then back to detection.
        let network = try cli(fixture, ["network", "set", "cellular", "--json"])
        #expect((try JSON.parse(network.output))["type"]?.stringValue == "cellular")
        #expect(try cli(fixture, ["network", "auto"]).output.contains("source routing_table"))

        // Webhooks: add shows the secret once, the list does not.
        let added = try cli(fixture, ["webhooks", "add", "http://127.0.0.1:9/hooks"])
        #expect(added.status == 0 && added.output.contains("whsec_"))
        let hooks = try cli(fixture, ["webhooks"])
        #expect(hooks.output.contains("http://127.0.0.1:9/hooks") && !hooks.output.contains("whsec_"))

        // Exit codes: a refused request 1, an unreachable daemon 4, a failed waited-for task 3, bad usage 64.
        let missing = try cli(fixture, ["show", "tsk_nope"])
        #expect(missing.status == 1 && missing.errors.contains("not_found"))
        // An id is one path segment, whatever it holds: never another route.
        let climbing = try cli(fixture, ["show", "../sessions"])
        #expect(climbing.status == 1 && climbing.errors.contains("not_found"), "\(climbing.output) \(climbing.errors)")
        #expect(try cli(fixture, ["ls"], url: "http://127.0.0.1:9").status == 4)
        fixture.sink.enqueue(.respond(status: 404))
        #expect(try cli(fixture, ["upload", "clip-1.bin", "--to", fixture.sink.url("/gone"), "--wait"]).status == 3)
        #expect(try cli(fixture, ["upload"]).status == 64)
    }

    @Test("cli: download URL --to PATH --sha256 --wait fetches the file; a wrong digest exits 3")
    func commandLineDownload() throws {
        let fixture = try Fixture()
        let nginx = try NginxServer(directory: fixture.scratch.file("nginx"))
        let source = fixture.scratch.makeFile("nginx/root/map.tiles", size: 700_000)
        let fetched = try cli(
            fixture, ["download", nginx.url("/map.tiles"), "--to", "./", "--sha256", sha256sum(source), "--wait"])
        #expect(fetched.status == 0, "\(fetched.output) \(fetched.errors)")
        #expect(fetched.output.contains("completed") && fetched.output.contains("100%"), "\(fetched.output)")
        #expect(Bytes(fixture.contents(fixture.data + "/map.tiles")) == Bytes(fixture.contents(source)))
        let wrong = try cli(
            fixture,
            [
                "download", nginx.url("/map.tiles"), "--to", "copy.tiles", "--sha256", String(repeating: "0", count: 64),
                "--wait", "--json",
            ])
        #expect(wrong.status == 3)
        let failed = try JSON.parse(wrong.output).arrayValue ?? []
        #expect(failed.count == 1 && failed[0]["error"]?["name"]?.stringValue == "download_checksum_mismatch", "\(wrong.output)")
        #expect(!FileManager.default.fileExists(atPath: fixture.data + "/copy.tiles"))
    }

    @Test("cli: watch renders one line per running task with a bar, rate and ETA, and a summary line")
    func commandLineWatch() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 1_000_000, then: .respond(status: 201)))
        _ = fixture.makeFile("slow.bin", size: 30_000_000)
        #expect(try cli(fixture, ["upload", "slow.bin", "--to", fixture.sink.url("/slow")]).status == 0)
        try #require(eventually(timeout: 10) { fixture.sink.totalBodyBytes > 5_000_000 })
        Thread.sleep(forTimeInterval: 1.2)  // a rate estimate needs two samples
        let frame = try cli(fixture, ["watch", "--once"])
        let lines = frame.output.split(separator: "\n")
        #expect(lines.count == 2, "\(frame.output)")
        let line = String(lines.first ?? "")
        #expect(line.contains("slow.bin") && line.contains("[#") && line.contains("/s") && line.contains("ETA "), "\(line)")
        #expect(lines.last?.hasPrefix("1 running") == true, "\(frame.output)")
        // The rendering itself is tested pure in BackhaulCLITests/WatchFrameTests.
    }
}

extension EndToEndTests {
    @Test("cli: watch in a terminal (a pty from script(1)) redraws frames in place and ends with --until-done")
    func commandLineWatchInTerminal() throws {
        // A progress event a second: the bars follow the event stream.
        let fixture = try Fixture(
            daemonArguments: ["--progress-interval", "1"],
            sink: .throttle(bytesPerSecond: 8_000_000, then: .respond(status: 201)))
        _ = fixture.makeFile("tty.bin", size: 24_000_000)
        #expect(try cli(fixture, ["upload", "tty.bin", "--to", fixture.sink.url("/tty")]).status == 0)
        let binary = URL(fileURLWithPath: DaemonProcess.binary).deletingLastPathComponent().appendingPathComponent("backhaul")
            .path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/script")
        process.arguments = ["-qfec", "\(binary) watch --until-done --interval 0.3", "/dev/null"]
        process.environment = [
            "BACKHAUL_URL": "http://127.0.0.1:\(fixture.daemon.port)", "PATH": "/usr/bin:/bin", "TERM": "xterm",
        ]
        let output = Pipe()
        process.standardOutput = output
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "\(text.suffix(2000))")
        let frames = text.components(separatedBy: "\u{1B}[H\u{1B}[2J").filter { !$0.isEmpty }
        #expect(frames.count >= 2, "frames are redrawn in place: \(frames.count)")
        #expect(frames.contains { $0.contains("tty.bin") && $0.contains("[#") && $0.contains("ETA") })
        #expect(
            frames.last?.contains("0 running") == true && frames.last?.contains("1 completed") == true, "\(frames.last ?? "")")
        // The progress came from the event stream: the running tasks were listed once, at the start.
        let metrics = try HTTPClient().send("GET", "http://127.0.0.1:\(fixture.daemon.port)/metrics")
        let figures = try PrometheusParser.parse(String(decoding: metrics.body, as: UTF8.self))
        func requests(_ route: String) -> Double {
            figures.filter { $0.key.hasPrefix("backhaul_http_requests_total{method=GET,route=\(route),") }.values.reduce(0, +)
        }
        #expect(requests("/v1/events") == 1)
        #expect(requests("/v1/sessions/{id}/tasks") == 1, "frames: \(frames.count)")
    }
}
