import BackhaulTesting
import Foundation
import JSONCodec
import PostgreSQL
import Testing
import Threads

/// Several daemons on one PostgreSQL (docs/fleet.md), as processes: one queue, takeover after a
/// SIGKILL, pinned tasks, one view of the fleet.
@Suite("Fleet: daemons on one PostgreSQL", .serialized)
final class FleetTests {
    let database: PostgresServer
    let scratch = TemporaryDirectory("backhaul-fleet")
    /// The shared root every node sees.
    let shared: String

    init() throws {
        database = try PostgresServer()
        shared = scratch.file("shared")
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
    }

    /// A node on the fleet's database; its own disk is `private-<id>`, the shared root is shared.
    func node(_ id: String, lease: Double, arguments: [String] = []) throws -> DaemonProcess {
        let own = scratch.file("private-\(id)")
        try FileManager.default.createDirectory(atPath: own, withIntermediateDirectories: true)
        return try DaemonProcess(
            stateDirectory: scratch.file("state-\(id)"), allowedRoot: shared,
            arguments: [
                "--state", database.url, "--node-id", id, "--lease-seconds", "\(lease)", "--shared-root", shared,
                "--allow-root", own,
            ] + arguments)
    }

    /// `file` posted on `node` in the session `session` as a batch of one, at 1 MiB/s (the node's
    /// policy), once it runs: the task as the 201 gave it.
    func runningUpload(on node: DaemonProcess, session: String, file: String, to url: String) throws -> JSON {
        try #require(try node.call("PUT", "/v1/sessions/\(session)", ["configuration": [:]]).0 == 201)
        try #require(try node.call("PUT", "/v1/policy", ["bandwidth_limit": .int(1 << 20)]).0 == 200)
        let (status, body) = try node.call(
            "POST", "/v1/sessions/\(session)/tasks", ["tasks": [["file": .string(file), "request": ["url": .string(url)]]]])
        try #require(status == 201, "\(body.serialized())")
        let task = try #require(body["tasks"]?.arrayValue?.first)
        let id = try #require(task["id"]?.stringValue)
        try #require(try node.waitForTask(id, state: "running", timeout: 20)["state"]?.stringValue == "running")
        return task
    }

    /// Waits for the task `id` to complete, as `node` answers for it, and checks that `nginx` holds
    /// `file`'s bytes at `path`.
    func expectDelivered(_ id: String, on node: DaemonProcess, to nginx: NginxServer, path: String, from file: String) throws {
        let done = try node.waitForTask(id, timeout: 60)
        #expect(done["state"]?.stringValue == "completed", "\(done.serialized())")
        #expect(
            Bytes(FileManager.default.contents(atPath: nginx.root + path) ?? Data())
                == Bytes(FileManager.default.contents(atPath: file) ?? Data([1])))
    }

    /// The ids of the tasks a node holds the lease of, as the database says.
    func leased(by node: String, _ db: PostgresConnection) throws -> Set<String> {
        let rows = try db.execute("SELECT id FROM tasks WHERE state = 'running' AND lease_node = $1", [.text(node)])
        return Set((0..<rows.count).compactMap { rows.string($0, 0) })
    }

    @Test(
        "three nodes upload 3,000 files from a shared root while one is SIGKILLed every 10 s: none lost, each exact, never two at once"
    )
    func takeoverUnderSIGKILL() throws {
        let nginx = try NginxServer(directory: scratch.file("nginx"), timingLog: true)
        let lease = 2.0
        let nodes = try ["n1", "n2", "n3"].map { try node($0, lease: lease) }
        // 100 KB/s a node (the policy set on one node is the fleet's): the 15.6 MB take about 50 s,
        // long enough for several kills to land in the work.
        let (policyStatus, policy) = try nodes[0].call("PUT", "/v1/policy", ["bandwidth_limit": .int(100_000)])
        try #require(policyStatus == 200, "\(policy.serialized())")
        let (status, body) = try nodes[0].call("PUT", "/v1/sessions/fleet", ["configuration": [:]])
        try #require(status == 201, "\(body.serialized())")
        let count = 3_000
        var ids: [String] = []
        for start in stride(from: 0, to: count, by: 500) {
            let tasks: [JSON] = (start..<start + 500).map { index in
                let name = "f\(index).bin"
                scratch.makeFile("shared/\(name)", size: 1_000 + index % 13 * 700)
                return ["file": .string(shared + "/" + name), "request": ["url": .string(nginx.url("/fleet/\(name)"))]]
            }
            // Any node takes tasks for any other.
            let (status, body) = try nodes[start / 500 % 3].call(
                "POST", "/v1/sessions/fleet/tasks", ["tasks": .array(tasks)], timeout: 60)
            try #require(status == 201, "\(body.serialized().prefix(300))")
            ids += body["tasks"]?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? []
        }
        try #require(ids.count == count)
        let db = try PostgresConnection(database.url)
        func finished() throws -> Int {
            Int(try db.execute("SELECT count(*) FROM tasks WHERE finished_at IS NOT NULL").int(0, 0) ?? 0)
        }
        // Kill a node every 10 s while work is left; start it again after two leases, so that the
        // others take its tasks over first.
        var takeovers: [Double] = []
        var kills = 0
        let deadline = Date().addingTimeInterval(240)
        while try finished() < count, Date() < deadline {
            Thread.sleep(forTimeInterval: 10)
            guard try finished() < count else { break }
            let victim = nodes[kills % 3]
            let id = "n\(kills % 3 + 1)"
            let held = try leased(by: id, db)
            victim.kill9()
            let killedAt = Date()
            kills += 1
            // Taken over: none of what it held is still leased to it.
            if !held.isEmpty {
                let taken = eventually(timeout: lease + 10, interval: 0.05) {
                    (try? leased(by: id, db).isDisjoint(with: held)) ?? false
                }
                #expect(taken, "\(id)'s \(held.count) tasks were not taken over")
                takeovers.append(Date().timeIntervalSince(killedAt))
            }
            Thread.sleep(forTimeInterval: 2 * lease)
            try victim.start()
        }
        let done = try finished()
        #expect(done == count, "finished \(done) of \(count) after \(kills) kills")
        #expect(kills >= 2, "the work ended before two kills")
        #expect(!takeovers.isEmpty, "no kill found a task leased to its node")
        #expect(takeovers.allSatisfy { $0 <= lease + 5 }, "takeovers after \(takeovers) s")
        // Every task completed, each file exact at the sink.
        let completed = try db.execute("SELECT count(*) FROM tasks WHERE state = 'completed'").int(0, 0)
        #expect(completed == Int64(count))
        var mismatched: [String] = []
        for index in 0..<count {
            let name = "f\(index).bin"
            if Bytes(FileManager.default.contents(atPath: nginx.root + "/fleet/" + name) ?? Data())
                != Bytes(FileManager.default.contents(atPath: shared + "/" + name) ?? Data([1]))
            {
                mismatched.append(name)
            }
        }
        #expect(mismatched.isEmpty, "\(mismatched.count) files differ: \(mismatched.prefix(5))")
        // No two requests for one file overlapped at the sink: one runner at a time.
        // Every request is in the log (an empty or missing log would show no overlap).
        let logged = Self.requests(inLog: nginx.accessLog)
        #expect(logged >= count, "\(logged) requests logged for \(count) files")
        let overlaps = Self.overlaps(inLog: nginx.accessLog)
        #expect(overlaps.isEmpty, "overlapping requests: \(overlaps.prefix(5))")
        print(
            "fleet: \(count) files, \(kills) kills, takeovers after \(takeovers.map { String(format: "%.2f", $0) }) s "
                + "(lease \(lease) s), \(Self.requests(inLog: nginx.accessLog)) requests at the sink")
    }

    /// Paths whose requests overlapped in time in nginx's timing log (`end duration method uri …`).
    static func overlaps(inLog path: String) -> [String] {
        var spans: [String: [(Double, Double)]] = [:]
        for line in ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count >= 4, let end = Double(fields[0]), let duration = Double(fields[1]) else { continue }
            spans[String(fields[3]), default: []].append((end - duration, end))
        }
        var found: [String] = []
        for (uri, list) in spans {
            let sorted = list.sorted { $0.0 < $1.0 }
            for (earlier, later) in zip(sorted, sorted.dropFirst()) where later.0 < earlier.1 - 0.001 {
                found.append("\(uri): \(earlier) and \(later)")
            }
        }
        return found
    }

    static func requests(inLog path: String) -> Int {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").count
    }

    @Test("a task pinned to its node waits with node_unavailable while that node is down, and completes when it returns")
    func pinnedTask() throws {
        let nginx = try NginxServer(directory: scratch.file("nginx-pin"))
        let lease = 1.0
        let a = try node("a", lease: lease)
        let b = try node("b", lease: lease)
        // On a's own disk, not under the shared root: pinned to a.
        let file = scratch.makeFile("private-a/big.bin", size: 4 << 20)
        let task = try runningUpload(on: a, session: "pin", file: file, to: nginx.url("/pin/big.bin"))
        let id = try #require(task["id"]?.stringValue)
        #expect(task["node"]?.stringValue == "a")
        a.kill9()
        // b answers for it, and never runs it.
        let waiting = try b.waitForTask(id, state: "waiting", timeout: lease + 10)
        #expect(waiting["waiting_reason"]?.stringValue == "node_unavailable", "\(waiting.serialized())")
        Thread.sleep(forTimeInterval: 3 * lease)
        #expect(try b.task(id)["state"]?.stringValue == "waiting")
        try a.start()
        try expectDelivered(id, on: b, to: nginx, path: "/pin/big.bin", from: file)
        // Both nodes are in the fleet's list.
        let nodes = try b.call("GET", "/v1/nodes").1["nodes"]?.arrayValue?.compactMap { $0["id"]?.stringValue }
        #expect(nodes == ["a", "b"])
    }

    /// SIGTERM while the database is gone: the node stops within its grace and a few seconds,
    /// whatever its lease (here the default 30 s); what it could not write is made good once the
    /// database and the node are back. Before, the engine waited on its writes until the lease
    /// fence closed and the writer until its 30 s of reconnecting ran out: 24 to 28 s.
    @Test("with the database gone, SIGTERM stops a node within its grace; back, its task completes")
    func stopWithDatabaseGone() throws {
        let nginx = try NginxServer(directory: scratch.file("nginx-gone"))
        let grace = 2.0
        let a = try node("a", lease: 30, arguments: ["--shutdown-grace", "\(grace)"])
        let file = scratch.makeFile("shared/gone.bin", size: 4 << 20)
        let task = try runningUpload(on: a, session: "gone", file: file, to: nginx.url("/gone/gone.bin"))
        let id = try #require(task["id"]?.stringValue)
        try database.stop(immediate: true)
        Thread.sleep(forTimeInterval: 1)
        let started = Date()
        let exit = a.terminate()
        let seconds = Date().timeIntervalSince(started)
        #expect(exit == 0)
        #expect(seconds < grace + 6, "the stop took \(seconds) s")
        try database.start()
        try a.start()
        try expectDelivered(id, on: a, to: nginx, path: "/gone/gone.bin", from: file)
    }
}

/// The sink log's overlap check, on logs made for it: it must see two runners at once.
@Suite("Fleet: the sink log's overlap check")
struct FleetLogTests {
    @Test("requests for one path that overlap in time are found; ones one after another, or for two paths, are not")
    func overlapsFound() throws {
        let scratch = TemporaryDirectory("backhaul-fleet-log")
        let path = scratch.file("access.log")
        // `end duration method uri status length`: /a's second request began (10.5) before its
        // first ended (11.0); /b's came one after the other; /c overlaps only /a.
        try """
        11.000 1.000 PUT /a 201 10
        11.200 0.700 PUT /a 201 10
        20.000 1.000 PUT /b 400 5
        22.000 1.500 PUT /b 201 10
        10.900 0.500 PUT /c 201 10
        """.write(toFile: path, atomically: true, encoding: .utf8)
        let found = FleetTests.overlaps(inLog: path)
        #expect(found.count == 1 && found.first?.hasPrefix("/a:") == true, "\(found)")
        #expect(FleetTests.requests(inLog: path) == 5)
    }
}
