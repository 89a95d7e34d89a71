import BackhaulTesting
import Foundation
import Glibc
import JSONCodec
import PostgreSQL
import Testing
import Threads

/// The fleet against faults of its database beyond a node's `kill -9` (docs/fleet.md, "Faults"):
/// daemons on a real PostgreSQL, each fault made as an operator would meet it.
@Suite("Fleet: faults of the database", .serialized)
final class FleetFaultTests {
    /// The database, the scratch directory and the shared root, as the kill -9 suite has them.
    let fleet: FleetTests
    var database: PostgresServer { fleet.database }
    var scratch: TemporaryDirectory { fleet.scratch }

    init() throws { fleet = try FleetTests() }

    func node(_ id: String, lease: Double = 2) throws -> DaemonProcess { try fleet.node(id, lease: lease) }

    /// Terminates every `LISTEN` connection of the fleet (`pg_terminate_backend`); how many.
    static func terminateListeners(_ db: PostgresConnection) throws -> Int {
        let rows = try db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'backhauld listen'")
        return rows.count
    }

    @Test("LISTEN lost while a policy is set on node-b: node-a answers the new policy within 2 s and starts no new task")
    func policyAfterLostListen() throws {
        let a = try node("a")
        let b = try node("b")
        try #require(try a.call("PUT", "/v1/sessions/s", ["configuration": [:]]).0 == 201)
        let db = try PostgresConnection(database.url)
        try #require(eventually(timeout: 10) { ((try? Self.terminateListeners(db)) ?? 0) >= 2 })
        // The LISTENs are terminated again and again while the PUT is in flight: its NOTIFY goes
        // out while node-a does not listen.
        let putting = Locked(true)
        let ready = Locked(false)
        let url = database.url
        let killer = Thread {
            guard let own = try? PostgresConnection(url) else { return }
            ready.withLockNotifyingAll { $0 = true }
            while putting.withLock({ $0 }) {
                _ = try? Self.terminateListeners(own)
                usleep(10_000)
            }
        }
        killer.start()
        try #require(ready.wait(until: { $0 }, timeout: 10) { $0 })
        let (status, body) = try b.call("PUT", "/v1/policy", ["transfers_enabled": false])
        let committed = Date()
        putting.withLock { $0 = false }
        try #require(status == 200, "\(body.serialized())")
        var seen: Double?
        _ = eventually(timeout: 10, interval: 0.02) {
            let enabled = (try? a.call("GET", "/v1/policy").1)?["transfers_enabled"]
            if enabled == .bool(false) { seen = Date().timeIntervalSince(committed) }
            return seen != nil
        }
        let after = try #require(seen, "node-a still answers transfers_enabled true 10 s after the commit")
        #expect(after <= 2, "node-a answered the new policy \(after) s after its commit")
        print("fleet faults: node-a answered the policy \(String(format: "%.2f", after)) s after its commit")
        let file = scratch.makeFile("private-a/new.bin", size: 1_000)
        let refused = try a.call(
            "POST", "/v1/sessions/s/tasks", ["file": .string(file), "request": ["url": "http://127.0.0.1:9/x"]])
        #expect(refused.0 == 409, "\(refused.1.serialized())")
        #expect(try db.execute("SELECT count(*) FROM tasks").int(0, 0) == 0)
    }

    @Test("a pinned task's 201 names its node, in an enabled session and in a disabled one, single and in a batch")
    func nodeInCreated() throws {
        let a = try node("a")
        try #require(try a.call("PUT", "/v1/sessions/on", ["configuration": [:]]).0 == 201)
        try #require(try a.call("PUT", "/v1/sessions/off", ["configuration": [:]]).0 == 201)
        try #require(try a.call("PATCH", "/v1/sessions/off", ["enabled": false]).0 == 200)
        let file = scratch.makeFile("private-a/pinned.bin", size: 1_000)
        let task: JSON = ["file": .string(file), "request": ["url": "http://127.0.0.1:9/x"]]
        for session in ["on", "off"] {
            let single = try a.call("POST", "/v1/sessions/\(session)/tasks", task)
            #expect(single.0 == 201, "\(single.1.serialized())")
            #expect(single.1["node"]?.stringValue == "a", "\(session): \(single.1.serialized())")
            let batch = try a.call("POST", "/v1/sessions/\(session)/tasks", ["tasks": [task]])
            #expect(batch.1["tasks"]?.arrayValue?.first?["node"]?.stringValue == "a", "\(session): \(batch.1.serialized())")
            let id = try #require(single.1["id"]?.stringValue)
            #expect(try a.task(id)["node"]?.stringValue == "a")
        }
    }

    @Test(
        "PostgreSQL crashed as soon as the sink has each file: a file with delete_file_on_success is never gone while its task is not completed"
    )
    func durableBeforeDelete() throws {
        let sink = try RecordingSink(directory: scratch.file("sink"))
        let a = try node("a")
        try #require(try a.call("PUT", "/v1/sessions/s", ["configuration": [:]]).0 == 201)
        var trials: [(id: String, file: String)] = []
        for trial in 0..<5 {
            let file = scratch.makeFile("shared/t\(trial).bin", size: 4_096)
            // Just after a restart the node may answer 503 while it connects again: a client's retry,
            // with its idempotency key.
            var (status, body) = (0, JSON.null)
            _ = eventually(timeout: 30, interval: 0.2) {
                (status, body) =
                    (try? a.call(
                        "POST", "/v1/sessions/s/tasks",
                        [
                            "file": .string(file), "request": ["url": .string(sink.url("/t\(trial)"))],
                            "delete_file_on_success": true, "idempotency_key": .string("t\(trial)"),
                        ])) ?? (0, .null)
                return status != 503 && status != 0
            }
            try #require(status == 201, "\(body.serialized())")
            trials.append((try #require(body["id"]?.stringValue), file))
            // The crash as soon as the sink has the file.
            let received = eventually(timeout: 30, interval: 0.002) { sink.requests.count > trial }
            try #require(received, "the sink never received trial \(trial)")
            try database.stop(immediate: true)
            try database.start()
        }
        for (id, file) in trials {
            let done = try a.waitForTask(id, timeout: 60)
            let state = done["state"]?.stringValue
            let present = FileManager.default.fileExists(atPath: file)
            #expect(state == "completed" || present, "\(id) is \(state ?? "?") with its file gone: \(done.serialized())")
            // The commit is visible to a reader a moment before its writer, once it is durable,
            // removes the file (a few milliseconds; more on a loaded machine).
            if state == "completed" {
                let removed = eventually(timeout: 5) { !FileManager.default.fileExists(atPath: file) }
                #expect(removed, "\(id) completed and kept its file: \(done.serialized())\n\(a.log(lastLines: 40))")
            }
        }
    }

    @Test(
        "one task's row set by hand to a request that is not JSON: it fails alone with -3100, named in the log, while the survivor takes the others over and stays ready"
    )
    func undecodableRow() throws {
        let nginx = try NginxServer(directory: scratch.file("nginx"))
        let lease = 2.0
        let a = try node("a", lease: lease)
        try #require(try a.call("PUT", "/v1/policy", ["bandwidth_limit": .int(50_000)]).0 == 200)
        try #require(try a.call("PUT", "/v1/sessions/s", ["configuration": [:]]).0 == 201)
        // Three tasks on the shared root, slow enough to be running when node-a dies.
        let tasks: [JSON] = (0..<3).map { index in
            let file = scratch.makeFile("shared/u\(index).bin", size: 1 << 20)
            return ["file": .string(file), "request": ["url": .string(nginx.url("/u/u\(index).bin"))]]
        }
        let (status, body) = try a.call("POST", "/v1/sessions/s/tasks", ["tasks": .array(tasks)])
        try #require(status == 201, "\(body.serialized())")
        let ids = try #require(body["tasks"]?.arrayValue?.compactMap { $0["id"]?.stringValue })
        let db = try PostgresConnection(database.url)
        // All three running on node-a, before node-b starts.
        let running = eventually(timeout: 20) {
            (try? db.execute("SELECT count(*) FROM tasks WHERE state = 'running' AND lease_node = 'a'").int(0, 0)) == 3
        }
        try #require(running, "the three tasks never ran on node-a")
        let b = try node("b", lease: lease)
        try db.execute("UPDATE tasks SET request = 'not json' WHERE id = $1", [.text(ids[0])])
        a.kill9()
        let killed = Date()
        // The two others are taken over and run by node-b; the bad one fails alone.
        let taken = eventually(timeout: lease + 15) {
            (try? db.execute(
                "SELECT count(*) FROM tasks WHERE id = ANY($1::text[]) AND (lease_node = 'b' OR finished_at IS NOT NULL)",
                [.text("{\(ids[1]),\(ids[2])}")]
            ).int(0, 0)) == 2
        }
        #expect(taken, "node-b took the two others over after \(Date().timeIntervalSince(killed)) s")
        let failed = try db.execute("SELECT state, error FROM tasks WHERE id = $1", [.text(ids[0])])
        #expect(failed.string(0, 0) == "failed")
        #expect(failed.string(0, 1)?.contains("-3100") == true, "\(failed.string(0, 1) ?? "no error")")
        // Ready all along, and the row named at error in the log.
        var unready = 0
        for _ in 0..<10 {
            if (try? b.call("GET", "/readyz").0) != 200 { unready += 1 }
            usleep(100_000)
        }
        #expect(unready == 0, "/readyz was not 200 in \(unready) of 10 samples")
        let log = (try? String(contentsOfFile: b.logFile, encoding: .utf8)) ?? ""
        let named = log.split(separator: "\n").contains {
            $0.contains(ids[0]) && $0.contains("-3100") && $0.contains("\"error\"")
        }
        #expect(named, "no error line names \(ids[0]): \(b.log(lastLines: 10))")
    }
}
