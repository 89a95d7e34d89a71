import BackhaulTesting
import Foundation
import JSONCodec
import PostgreSQL
import Testing

/// The fleet against the database's faults (docs/fleet.md, "When a node cannot reach the
/// database"): a node whose backends stop answering, and PostgreSQL restarted under load. In
/// `FleetTests`, whose nodes and database they use.
extension FleetTests {
    /// The server processes of `node`'s connections: pg_stat_activity's `client_port` matched
    /// against the node's sockets to the server (`ss -tnpH`), with their states.
    func backends(of node: DaemonProcess, _ db: PostgresConnection) throws -> [(pid: Int32, state: String)] {
        let ss = Process()
        ss.executableURL = URL(fileURLWithPath: "/usr/bin/ss")
        ss.arguments = ["-tnpH", "dst", "127.0.0.1:\(database.port)"]
        let output = Pipe()
        ss.standardOutput = output
        try ss.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        ss.waitUntilExit()
        let ports = text.split(separator: "\n").filter { $0.contains("pid=\(node.pid),") }.compactMap { line in
            line.split(separator: " ", omittingEmptySubsequences: true).dropFirst(3).first?.split(separator: ":").last
        }.compactMap { Int64($0) }
        guard !ports.isEmpty else { return [] }
        let rows = try db.execute(
            "SELECT pid, coalesce(state, '') FROM pg_stat_activity WHERE client_port = ANY($1::int[])",
            [.text("{" + ports.map(String.init).joined(separator: ",") + "}")])
        return (0..<rows.count).map { (Int32(rows.int($0, 0) ?? 0), rows.string($0, 1) ?? "") }
    }

    @Test(
        "a node whose database backends stop stops sending within its lease less the margin, says why, is taken over without overlap, and takes work again"
    )
    func stalledBackends() throws {
        let nginx = try NginxServer(directory: scratch.file("nginx-stall"), timingLog: true)
        let lease = 2.0
        let a = try node("a", lease: lease)
        // 200 KB/s: the 3 MB file takes about 15 s, so the stall meets it mid-way.
        try #require(try a.call("PUT", "/v1/policy", ["bandwidth_limit": .int(200_000)]).0 == 200)
        try #require(try a.call("PUT", "/v1/sessions/stall", ["configuration": [:]]).0 == 201)
        let file = scratch.makeFile("shared/big.bin", size: 3_000_000)
        let (status, body) = try a.call(
            "POST", "/v1/sessions/stall/tasks", ["file": .string(file), "request": ["url": .string(nginx.url("/stall/big.bin"))]])
        try #require(status == 201, "\(body.serialized())")
        let id = try #require(body["id"]?.stringValue)
        try #require(try a.waitForTask(id, state: "running", timeout: 20)["state"]?.stringValue == "running")
        let b = try node("b", lease: lease)
        let db = try PostgresConnection(database.url)
        Thread.sleep(forTimeInterval: 1)
        // Stopped between transactions: a stopped backend inside one would hold its locks (the
        // events' advisory lock) and stall every node, which is another fault.
        var stopped: [Int32] = []
        var stoppedAt = 0.0
        for _ in 0..<50 {
            let found = try backends(of: a, db)
            if !found.isEmpty, found.allSatisfy({ $0.state == "idle" }) {
                stoppedAt = Date().timeIntervalSince1970
                for backend in found { kill(backend.pid, SIGSTOP) }
                stopped = found.map(\.pid)
                break
            }
            Thread.sleep(forTimeInterval: 0.02)
        }
        try #require(!stopped.isEmpty, "a's backends were not found idle")
        defer { for pid in stopped { kill(pid, SIGCONT) } }
        // b takes the task over once a's lease ran out in the database.
        let taken = eventually(timeout: 3 * lease + 10, interval: 0.05) {
            let rows = try? db.execute("SELECT lease_node FROM tasks WHERE id = $1", [.text(id)])
            return rows?.string(0, 0) == "b"
        }
        #expect(taken, "b did not take the task over")
        Thread.sleep(forTimeInterval: 1)
        for pid in stopped { kill(pid, SIGCONT) }
        let done = try b.waitForTask(id, timeout: 60)
        #expect(done["state"]?.stringValue == "completed", "\(done.serialized())")
        #expect(
            Bytes(FileManager.default.contents(atPath: nginx.root + "/stall/big.bin") ?? Data())
                == Bytes(FileManager.default.contents(atPath: file) ?? Data([1])))
        // a's request ended (the fence aborted it) before its lease could have run out anywhere.
        let spans = Self.spans(inLog: nginx.accessLog, uri: "/stall/big.bin")
        let first = try #require(spans.first)
        let log = a.log(lastLines: 60)
        #expect(
            first.end - stoppedAt < lease,
            "a's request ended \(first.end - stoppedAt) s after its backends stopped (at \(stoppedAt)); a's log:\n\(log)")
        #expect(FleetTests.overlaps(inLog: nginx.accessLog).isEmpty, "\(spans)")
        #expect(spans.count >= 2, "\(spans)")
        let said = a.log(lastLines: 400).split(separator: "\n").filter { $0.contains("the lease may run out") }
        #expect(said.count >= 1 && said.allSatisfy { $0.contains("\"lease.seconds\":\"2.0\"") }, "\(said)")
        // a beats again and takes work again: a task pinned to it completes.
        let pinned = scratch.makeFile("private-a/after.bin", size: 10_000)
        let (again, task) = try a.call(
            "POST", "/v1/sessions/stall/tasks",
            ["file": .string(pinned), "request": ["url": .string(nginx.url("/stall/after.bin"))]])
        try #require(again == 201, "\(task.serialized())")
        let after = try a.waitForTask(try #require(task["id"]?.stringValue), timeout: 30)
        #expect(after["state"]?.stringValue == "completed", "\(after.serialized())")
        print(
            "stalled backends: a's request ended \(String(format: "%.2f", first.end - stoppedAt)) s after the stop "
                + "(lease \(lease) s); \(spans.count) requests, none overlapping")
    }

    /// The node's backends stopped for good (a server that accepts bytes and never answers, as a
    /// stopped process or a half-dead link does): no call waits on them past the lease. A write
    /// answers within the lease and a few seconds, 201 once its connections are made anew, and
    /// SIGTERM stops the node within its grace and a few seconds. Before, the writer's connection
    /// had no bound: the stop waited on the writer for good (SIGKILLed after 40 s).
    @Test("a node whose database backends stay stopped answers a write within its lease, and stops within its grace")
    func backendsStoppedForGood() throws {
        let lease = 2.0
        let grace = 2.0
        let a = try node("a", lease: lease, arguments: ["--shutdown-grace", "\(grace)"])
        try #require(try a.call("PUT", "/v1/sessions/hung", ["configuration": [:]]).0 == 201)
        let file = scratch.makeFile("shared/hung.bin", size: 1000)
        let db = try PostgresConnection(database.url)
        Thread.sleep(forTimeInterval: 1)
        var stopped: [Int32] = []
        for _ in 0..<100 where stopped.isEmpty {
            let found = try backends(of: a, db)
            if !found.isEmpty, found.allSatisfy({ $0.state == "idle" }) {
                for backend in found { kill(backend.pid, SIGSTOP) }
                stopped = found.map(\.pid)
            }
            Thread.sleep(forTimeInterval: 0.02)
        }
        try #require(!stopped.isEmpty, "a's backends were not found idle")
        defer { for pid in stopped { kill(pid, SIGCONT) } }
        // A call on a stalled connection is given up after a lease: the write answers 503 (a read
        // of its session met a stalled reader: nothing changed) or 201; its retry, on connections
        // made anew (the writer's too), 201.
        var answers: [(Int, Double)] = []
        var started = Date()
        for _ in 0..<8 {
            started = Date()
            let (status, body) = try a.call(
                "POST", "/v1/sessions/hung/tasks", ["file": .string(file), "request": ["url": "http://127.0.0.1:9/hung"]],
                timeout: 30)
            let seconds = Date().timeIntervalSince(started)
            answers.append((status, seconds))
            #expect(seconds < lease + 5, "the POST was answered after \(seconds) s")
            if status == 201 { break }
            #expect(status == 503 && body["code"]?.stringValue == "service_unavailable", "\(status) \(body.serialized())")
        }
        #expect(answers.last?.0 == 201, "answers: \(answers)")
        started = Date()
        let exit = a.terminate(timeout: 40)
        let stopping = Date().timeIntervalSince(started)
        #expect(exit == 0)
        #expect(stopping < grace + 8, "the stop took \(stopping) s; the log:\n\(a.log(lastLines: 30))")
        // What was answered 503 was not stored, also once the stopped sessions run again (their
        // transactions never got a COMMIT).
        for pid in stopped { kill(pid, SIGCONT) }
        Thread.sleep(forTimeInterval: 1)
        #expect(try db.execute("SELECT count(*) FROM tasks WHERE session_id = 'hung'").int(0, 0) == 1)
        print(
            "backends stopped for good: POSTs answered \(answers.map { "\($0.0) in \(String(format: "%.2f", $0.1)) s" }), "
                + "SIGTERM to exit \(String(format: "%.2f", stopping)) s (lease \(lease) s, grace \(grace) s)")
    }

    /// Only the LISTEN session of a node stopped (its socket stays open and the server's kernel
    /// acknowledges the keepalives, so nothing looks lost): the node probes the connection when it
    /// has heard nothing for a while, gives it up after a lease, listens anew and reads everything
    /// again. A policy set on the other node is in force there within a few seconds. Before, the
    /// node went on without the other nodes' changes for as long as the session stayed stopped.
    @Test("a node whose LISTEN session stops hears the other nodes again within a lease and a few seconds")
    func listenerStopped() throws {
        let lease = 2.0
        let a = try node("a", lease: lease)
        let b = try node("b", lease: lease)
        let db = try PostgresConnection(database.url)
        func limit(_ daemon: DaemonProcess) -> Int64? {
            (try? daemon.call("GET", "/v1/policy"))?.1["bandwidth_limit"]?.intValue
        }
        try #require(try a.call("PUT", "/v1/policy", ["bandwidth_limit": .int(100_000)]).0 == 200)
        try #require(eventually(timeout: 5) { limit(b) == 100_000 })
        let pids = try backends(of: b, db).map(\.pid)
        let rows = try db.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid = ANY($1::int[]) AND application_name = 'backhauld listen'",
            [.text("{" + pids.map(String.init).joined(separator: ",") + "}")])
        let listener = try #require(rows.int(0, 0).map { Int32($0) }, "b's LISTEN session was not found among \(pids)")
        kill(listener, SIGSTOP)
        defer { kill(listener, SIGCONT) }
        Thread.sleep(forTimeInterval: 0.5)
        let started = Date()
        try #require(try a.call("PUT", "/v1/policy", ["bandwidth_limit": .int(200_000)]).0 == 200)
        let seen = eventually(timeout: 3 * lease + 10) { limit(b) == 200_000 }
        let seconds = Date().timeIntervalSince(started)
        #expect(seen, "b still shows \(limit(b).map(String.init) ?? "none") after \(seconds) s")
        #expect(seconds < 2 * lease + 4, "b took \(seconds) s")
        print("listener stopped: b in force \(String(format: "%.2f", seconds)) s after the change (lease \(lease) s)")
    }

    @Test(
        "PostgreSQL restarted under load (pg_ctl -m fast, then -m immediate): the nodes reconnect and every task answered 2xx completes, exact",
        arguments: [false, true])
    func restartUnderLoad(immediate: Bool) throws {
        let nginx = try NginxServer(directory: scratch.file("nginx-restart-\(immediate)"))
        let nodes = try ["a", "b"].map { try node($0, lease: 2) }
        try #require(try nodes[0].call("PUT", "/v1/sessions/load", ["configuration": ["retry": ["max_attempts": 1000]]]).0 == 201)
        var accepted: [String: String] = [:]  // task id -> file name
        var batch = 0
        func post(until deadline: Date) throws {
            while Date() < deadline {
                batch += 1
                let names = (0..<10).map { "r\(immediate)-\(batch)-\($0).bin" }
                let tasks: [JSON] = names.map { name in
                    scratch.makeFile("shared/\(name)", size: 20_000)
                    return [
                        "file": .string(shared + "/" + name), "request": ["url": .string(nginx.url("/load/\(name)"))],
                        "idempotency_key": .string(name),
                    ]
                }
                let (status, body) =
                    (try? nodes[batch % 2].call("POST", "/v1/sessions/load/tasks", ["tasks": .array(tasks)])) ?? (0, [:])
                guard status == 200 || status == 201 else {
                    Thread.sleep(forTimeInterval: 0.05)
                    continue
                }
                for (name, task) in zip(names, body["tasks"]?.arrayValue ?? []) {
                    if let id = task["id"]?.stringValue { accepted[id] = name }
                }
            }
        }
        try post(until: Date().addingTimeInterval(2))
        try database.stop(immediate: immediate)
        try post(until: Date().addingTimeInterval(1))
        try database.start()
        try post(until: Date().addingTimeInterval(3))
        #expect(accepted.count >= 100, "\(accepted.count) accepted")
        for node in nodes {
            let ready = eventually(timeout: 30) { (try? node.call("GET", "/readyz").0) == 200 }
            #expect(ready, "\(node.log(lastLines: 20))")
        }
        var missing: [String] = []
        let finished = eventually(timeout: 120, interval: 0.5) {
            missing = accepted.keys.filter { (try? nodes[0].task($0)["state"]?.stringValue) != "completed" }
            return missing.isEmpty
        }
        #expect(finished, "\(missing.count) of \(accepted.count) not completed: \(missing.prefix(3))")
        let differing = accepted.values.filter { name in
            Bytes(FileManager.default.contents(atPath: nginx.root + "/load/" + name) ?? Data())
                != Bytes(FileManager.default.contents(atPath: shared + "/" + name) ?? Data([1]))
        }
        #expect(differing.isEmpty, "\(differing.count) files differ")
        print("restart (\(immediate ? "immediate" : "fast")): \(accepted.count) tasks answered 2xx, all completed and exact")
    }

    @Test("a claim a node acts on survives PostgreSQL crashing right after it: no other node can claim the task meanwhile")
    func claimSurvivesCrash() throws {
        let nginx = try NginxServer(directory: scratch.file("nginx-claim"))
        let db = try PostgresConnection(database.url)
        // The WAL writer flushes commits that did not wait for the disk every wal_writer_delay:
        // 10 s here, and a lease of 30 s puts the heartbeat's own flushes 10 s apart.
        try db.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        try db.execute("SELECT pg_reload_conf()")
        let a = try node("a", lease: 30)
        try #require(try a.call("PUT", "/v1/policy", ["bandwidth_limit": .int(100_000)]).0 == 200)
        try #require(try a.call("PUT", "/v1/sessions/claim", ["configuration": [:]]).0 == 201)
        Thread.sleep(forTimeInterval: 0.5)
        let file = scratch.makeFile("shared/claim.bin", size: 2_000_000)
        let (status, body) = try a.call(
            "POST", "/v1/sessions/claim/tasks", ["file": .string(file), "request": ["url": .string(nginx.url("/claim.bin"))]])
        try #require(status == 201, "\(body.serialized())")
        let id = try #require(body["id"]?.stringValue)
        func row(_ db: PostgresConnection) throws -> String {
            let rows = try db.execute("SELECT state || ' ' || coalesce(lease_node, '-') FROM tasks WHERE id = $1", [.text(id)])
            return rows.string(0, 0) ?? "missing"
        }
        try #require(eventually(timeout: 10, interval: 0.002) { (try? row(db)) == "running a" })
        // a sends from now on; it is held still so that it cannot claim the task again itself.
        kill(a.pid, SIGSTOP)
        defer { kill(a.pid, SIGCONT) }
        try database.stop(immediate: true)
        try database.start()
        #expect(try row(try PostgresConnection(database.url)) == "running a")
    }

    /// The request spans (start, end; epoch seconds) for `uri` in nginx's timing log, by start.
    static func spans(inLog path: String, uri: String) -> [(start: Double, end: Double)] {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ")
            guard fields.count >= 4, fields[3] == uri, let end = Double(fields[0]), let duration = Double(fields[1]) else {
                return nil
            }
            return (end - duration, end)
        }.sorted { $0.start < $1.start }
    }
}
