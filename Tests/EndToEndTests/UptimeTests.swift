import BackhaulTesting
import Curl
import Foundation
import Glibc
import JSONCodec
import Testing

/// Months of uptime (docs/uptime.md): finished tasks go after their retention, the state stays bounded,
/// a state written by a newer build is refused.
extension EndToEndTests {
    static let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

    /// What a running daemon holds open and on disk.
    func footprint(_ daemon: DaemonProcess) -> (fds: Int, bytes: Int64) {
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(daemon.pid)/fd").count) ?? -1
        let files = (try? FileManager.default.contentsOfDirectory(atPath: daemon.stateDirectory)) ?? []
        let bytes = files.reduce(Int64(0)) { total, name in
            let size =
                (try? FileManager.default.attributesOfItem(atPath: daemon.stateDirectory + "/" + name)[.size] as? NSNumber)??
                .int64Value
            return total + (size ?? 0)
        }
        return (fds, bytes)
    }

    @Test("retention: a finished task whose webhooks were delivered goes after its retention; one still owed a delivery stays")
    func retentionWaitsForDeliveries() throws {
        let fixture = try Fixture(daemonArguments: ["--finished-task-retention", "2"])
        let receiver = try WebhookReceiver(directory: fixture.scratch.path, secrets: [Self.secret])
        try fixture.session("delivered")
        try fixture.session("owed")
        _ = try fixture.subscribe(receiver.url, secret: Self.secret, events: ["task.completed"], session: "delivered")
        // A receiver that is not there: the delivery stays pending (its next retry is minutes away).
        _ = try fixture.subscribe(
            "http://127.0.0.1:\(try freePort())/hooks", secret: Self.secret, events: ["task.completed"],
            session: "owed")
        let file = fixture.makeFile("a.bin", size: 1000)
        let delivered = try fixture.enqueue(file, session: "delivered")
        let owed = try fixture.enqueue(file, session: "owed")
        #expect(try fixture.daemon.waitForTask(delivered)["state"]?.stringValue == "completed")
        #expect(try fixture.daemon.waitForTask(owed)["state"]?.stringValue == "completed")
        #expect(eventually(timeout: 10) { receiver.accepted.count == 1 })
        let gone = eventually(timeout: 15) { (try? fixture.daemon.call("GET", "/v1/tasks/\(delivered)").0) == 404 }
        fixture.expectLog(gone, "the delivered task is still there")
        #expect(try fixture.daemon.call("GET", "/v1/tasks/\(delivered)/attempts").0 == 404)
        #expect(
            try fixture.daemon.call("GET", "/v1/tasks/\(owed)").1["state"]?.stringValue == "completed", "kept: a delivery is owed"
        )
        let metrics = try HTTPClient().send("GET", "http://127.0.0.1:\(fixture.daemon.port)/metrics")
        let figures = try PrometheusParser.parse(String(decoding: metrics.body, as: UTF8.self))
        #expect(figures["backhaul_tasks_pruned_total{}"] == 1, "\(figures.filter { $0.key.contains("prune") })")
        #expect((figures["backhaul_oldest_finished_task_seconds{}"] ?? -1) >= 0)
    }

    @Test("a session's own finished_task_retention wins over the daemon's")
    func sessionRetention() throws {
        let fixture = try Fixture(daemonArguments: ["--finished-task-retention", "86400"])
        try fixture.session("short", ["finished_task_retention": 1])
        try fixture.session("long")
        let file = fixture.makeFile("a.bin", size: 1000)
        let short = try fixture.enqueue(file, session: "short")
        let long = try fixture.enqueue(file, session: "long")
        _ = try fixture.daemon.waitForTask(short)
        _ = try fixture.daemon.waitForTask(long)
        // The sweep follows the shortest retention in force (the session's 1 s), not the daemon's.
        #expect(eventually(timeout: 10) { (try? fixture.daemon.call("GET", "/v1/tasks/\(short)").0) == 404 })
        #expect(try fixture.daemon.call("GET", "/v1/tasks/\(long)").0 == 200)
    }

    /// 3,000 tasks through a daemon with a short retention: the state directory ends under
    /// 16 MiB (pruned rows, pages returned by the incremental vacuum, a bounded WAL) and the
    /// daemon holds about as many descriptors as after the first batch (runs here: 35–46 at the
    /// end for 38–42 after the first batch, the idle connections of the moment).
    @Test("3,000 tasks churned leave the state directory under 16 MiB and the descriptor count flat")
    func churnStaysBounded() throws {
        let fixture = try Fixture(daemonArguments: ["--finished-task-retention", "1", "--max-transfers", "32"])
        try fixture.session("s1", ["max_connections_per_host": 32])
        let files = (0..<100).map { fixture.makeFile("f\($0).bin", size: 4096) }
        var baseline: (fds: Int, bytes: Int64)?
        for round in 0..<30 {
            let batch = JSON.array(
                files.enumerated().map { index, file in
                    [
                        "file": .string(file), "request": ["url": .string(fixture.sink.url("/churn/\(round)/\(index)"))],
                        "description": .string(String(repeating: "x", count: 200)),
                    ]
                })
            let (status, body) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", ["tasks": batch])
            try #require(status == 201, "\(body.serialized())")
            let done = eventually(timeout: 60) {
                (try? fixture.daemon.call("GET", "/v1/sessions/s1").1["task_counts"]?["completed"]?.intValue).map { $0 >= 100 }
                    ?? false
                    || (try? fixture.daemon.call("GET", "/v1/sessions/s1").1["task_counts"]?["queued"]?.intValue) == 0
                        && (try? fixture.daemon.call("GET", "/v1/sessions/s1").1["task_counts"]?["running"]?.intValue) == 0
            }
            try #require(done, "round \(round)")
            if round == 0 { baseline = footprint(fixture.daemon) }
        }
        // Everything ended; let retention and the vacuum catch up.
        #expect(
            eventually(timeout: 30) {
                (try? fixture.daemon.call("GET", "/v1/sessions/s1").1["task_counts"]?["completed"]?.intValue) == 0
            })
        Thread.sleep(forTimeInterval: 2)
        let end = footprint(fixture.daemon)
        let start = try #require(baseline)
        print("churn: 3000 tasks; state \(start.bytes) → \(end.bytes) bytes, descriptors \(start.fds) → \(end.fds)")
        #expect(end.bytes < 16 << 20, "the state directory holds \(end.bytes) bytes")
        // Idle connections (to the sink, up to 32, and from this test's own API calls) come and go
        // by a few; a leak of one descriptor per hundred tasks would be 30 more.
        #expect(end.fds <= start.fds + 12, "descriptors \(start.fds) → \(end.fds)")
        #expect(fixture.sink.requests.count == 3000)
        // The engine's writes paused at the end: the checkpointer copied the log back then.
        let metrics = try HTTPClient().send("GET", "http://127.0.0.1:\(fixture.daemon.port)/metrics")
        let figures = try PrometheusParser.parse(String(decoding: metrics.body, as: UTF8.self))
        #expect(
            (figures["backhaul_wal_checkpoints_total{mode=passive}"] ?? 0) >= 1, "\(figures.filter { $0.key.contains("wal") })")
        #expect(figures["backhaul_wal_checkpoints_total{mode=truncate}"] != nil)
        #expect(figures["backhaul_wal_checkpoints_total{mode=busy}"] != nil)
    }

    @Test("a state directory written by a newer backhauld is refused, untouched, with exit status 66")
    func newerStateRefused() throws {
        let fixture = try Fixture()
        try fixture.session()
        #expect(fixture.daemon.terminate() == 0)
        let database = fixture.daemon.stateDirectory + "/backhaul.db"
        let edit = Process()
        edit.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        edit.arguments = [
            "python3", "-c", "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); db.execute('PRAGMA user_version = 999')",
            database,
        ]
        try edit.run()
        edit.waitUntilExit()
        let before = FileManager.default.contents(atPath: database)
        #expect(throws: DaemonProcess.DaemonError.self) { try fixture.daemon.start() }
        #expect(fixture.daemon.exitStatus == 66)
        #expect(fixture.daemon.log(lastLines: 5).contains("newer backhauld"), "\(fixture.daemon.log(lastLines: 5))")
        #expect(FileManager.default.contents(atPath: database) == before, "the newer state is left as it was")
    }
}
