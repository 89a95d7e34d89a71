import BackhaulTesting
import Curl
import Foundation
import Glibc
import JSONCodec
import Testing

/// Issue 36.5: a state with a run of damaged pages in backhaul.db kept the daemon from starting.
/// Each test writes a real state through the API, stops the daemon, damages the files as a disk
/// would, and starts it again: by default it salvages (the damaged files kept in corrupt-*/, every
/// readable row in a fresh state, the salvage shown by /v1/info and /metrics); with
/// `--on-corrupt-state refuse` it exits 65 and touches nothing.
extension EndToEndTests {
    /// Tasks written by `writeState`.
    static let corruptStateTasks = 1_500

    @Test("garbage over two pages of the tasks table: refuse exits 65; salvage starts with every other task, counting the lost")
    func corruptTablePages() throws {
        let fixture = try Fixture(daemonArguments: ["--on-corrupt-state", "refuse"])
        let webhook = try writeState(fixture)
        #expect(fixture.daemon.terminate() == 0)
        let lost = try Int(#require(Int(damage(fixture, "table"))))
        #expect(lost > 0)
        let before = try stateFiles(fixture)

        #expect(throws: DaemonProcess.DaemonError.self) { try fixture.daemon.start() }
        #expect(fixture.daemon.exitStatus == 65, "\(fixture.daemon.log(lastLines: 5))")
        #expect(try stateFiles(fixture) == before, "refuse leaves the database as it was, where it was")

        let daemon = try DaemonProcess(
            stateDirectory: fixture.daemon.stateDirectory, allowedRoot: fixture.data, arguments: [])
        let state = try expectSalvaged(daemon)
        let report =
            (try? String(contentsOfFile: (state["salvaged_from"]?.stringValue ?? "") + "/salvage.json", encoding: .utf8)) ?? ""
        #expect(state["rows_lost"]?.intValue == Int64(lost), "\(report)")
        #expect(try taskTotal(daemon) == Self.corruptStateTasks - lost, "\(report)")
        #expect(try daemon.call("GET", "/v1/sessions/s1").0 == 200)
        let hooks = try daemon.call("GET", "/v1/sessions/s1/webhooks").1["webhooks"]?.arrayValue ?? []
        #expect(hooks.map { $0["id"] } == [webhook["id"]])
        // The fresh state takes new tasks, with ids and seqs of its own.
        let file = fixture.makeFile("after.bin", size: 10)
        let (status, created) = try daemon.call(
            "POST", "/v1/sessions/s1/tasks",
            ["file": .string(file), "request": ["url": .string(fixture.sink.url("/u")), "method": "PUT"]])
        #expect(status == 201, "\(created.serialized())")
        #expect(try taskTotal(daemon) == Self.corruptStateTasks - lost + 1)
        // The next start finds a sound state: the last salvage is still shown, not counted again.
        #expect(daemon.terminate() == 0)
        try daemon.start()
        #expect(try daemon.call("GET", "/v1/info").1["state"]?["salvaged_at"] == state["salvaged_at"])
        #expect(try salvageCount(daemon) == 0)
        #expect(try corruptDirectories(fixture).count == 1)
    }

    @Test("garbage over a page of a tasks index: salvaged, every row copied, none lost")
    func corruptIndexPage() throws {
        let fixture = try Fixture()
        _ = try writeState(fixture)
        #expect(fixture.daemon.terminate() == 0)
        _ = try damage(fixture, "index")
        try fixture.daemon.start()
        let state = try expectSalvaged(fixture.daemon)
        #expect(state["rows_lost"]?.intValue == 0, "\(state.serialized())")
        #expect(try taskTotal(fixture.daemon) == Self.corruptStateTasks)
    }

    @Test("garbage over the WAL's header (SQLite would ignore the log): salvaged, what the log held unknown")
    func corruptWALHeader() throws {
        let fixture = try Fixture()
        _ = try writeState(fixture)
        fixture.daemon.kill9()
        let walBytes = try #require(Int(damage(fixture, "wal")))
        #expect(walBytes > 32, "the WAL held frames")
        try fixture.daemon.start()
        let state = try expectSalvaged(fixture.daemon)
        #expect(state["rows_lost"] == .null, "\(state.serialized())")
        #expect(state["salvage_reason"]?.stringValue?.contains("WAL") == true)
        let moved = try corruptDirectories(fixture)[0]
        #expect(FileManager.default.fileExists(atPath: moved + "/backhaul.db-wal"))
    }

    @Test("a state file cut short: salvaged, the rows before the cut kept")
    func truncatedState() throws {
        let fixture = try Fixture()
        _ = try writeState(fixture)
        #expect(fixture.daemon.terminate() == 0)
        _ = try damage(fixture, "truncate")
        try fixture.daemon.start()
        let state = try expectSalvaged(fixture.daemon)
        let total = try taskTotal(fixture.daemon)
        fixture.expectLog(total > 0 && total < Self.corruptStateTasks, "\(total) tasks; \(state.serialized())")
        if let lost = state["rows_lost"]?.intValue { #expect(lost >= Int64(Self.corruptStateTasks - total)) }
        let folder = try #require(state["salvaged_from"]?.stringValue)
        #expect(!FileManager.default.fileExists(atPath: folder + "/salvage-read.db"), "the grown copy it read is removed")
    }

    // MARK: Helpers

    /// A session whose 1,500 tasks wait (cellular, not allowed), and a webhook whose receiver is
    /// away, so its deliveries stay undelivered. Returns the webhook.
    private func writeState(_ fixture: Fixture) throws -> JSON {
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "cellular"]).0 == 200)
        try fixture.session("s1", ["allows_cellular_access": false])
        let webhook = try fixture.subscribe("http://127.0.0.1:\(try freePort())/hook")
        let file = fixture.makeFile("a.bin", size: 100)
        for batch in 0..<3 {
            let tasks = (0..<Self.corruptStateTasks / 3).map { index -> JSON in
                [
                    "file": .string(file), "description": .string("task \(batch)-\(index) " + String(repeating: "x", count: 100)),
                    "request": ["url": .string(fixture.sink.url("/u/\(batch)/\(index)")), "method": "PUT"],
                ]
            }
            let (status, body) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", ["tasks": .array(tasks)])
            try #require(status == 201, "\(body.serialized())")
        }
        #expect(try taskTotal(fixture.daemon) == Self.corruptStateTasks)
        return webhook
    }

    /// Damages the stopped daemon's state (python3's sqlite3 finds the pages through `dbstat`):
    /// "table" writes random bytes over two leaf pages of `tasks` and prints how many rows they
    /// held; "index" over a leaf page of `tasks_by_session`; "wal" over the WAL's 32-byte header
    /// and prints the WAL's size; "truncate" cuts the database to 60 % of its pages.
    private func damage(_ fixture: Fixture, _ mode: String) throws -> String {
        let script = """
            import os, random, sqlite3, sys
            mode, path = sys.argv[1], sys.argv[2]
            random.seed(36)
            def garbage(n): return bytes(random.getrandbits(8) for _ in range(n))
            if mode == "wal":
                size = os.path.getsize(path + "-wal")
                with open(path + "-wal", "r+b") as f: f.write(garbage(32))
                print(size); sys.exit(0)
            db = sqlite3.connect(path)
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            size = db.execute("PRAGMA page_size").fetchone()[0]
            def leaves(name): return db.execute(
                "SELECT pageno, ncell FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY path", (name,)).fetchall()
            count = db.execute("PRAGMA page_count").fetchone()[0]
            if mode == "table":
                pages = leaves("tasks")
                hit = [pages[len(pages) // 3], pages[2 * len(pages) // 3]]
            elif mode == "index":
                pages = leaves("tasks_by_session")
                hit = [pages[len(pages) // 2]]
            db.close()
            if mode == "truncate":
                os.truncate(path, size * (count * 6 // 10))
                print(0); sys.exit(0)
            with open(path, "r+b") as f:
                for page, cells in hit:
                    f.seek((page - 1) * size); f.write(garbage(size))
            print(sum(cells for _, cells in hit))
            """
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", script, mode, fixture.daemon.stateDirectory + "/backhaul.db"]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        try #require(process.terminationStatus == 0, "damage \(mode) failed")
        return text.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Checks the daemon salvaged at this start: the damaged files in one corrupt-*/ directory with
    /// the report, /v1/info's `state` naming it, /metrics counting it. Returns `state`.
    private func expectSalvaged(_ daemon: DaemonProcess) throws -> JSON {
        let state = try #require(daemon.call("GET", "/v1/info").1["state"])
        let folder = try #require(state["salvaged_from"]?.stringValue, "\(state.serialized())")
        #expect(folder.hasPrefix(daemon.stateDirectory + "/corrupt-"))
        #expect(FileManager.default.fileExists(atPath: folder + "/backhaul.db"))
        #expect(FileManager.default.fileExists(atPath: folder + "/salvage.json"))
        #expect(state["salvaged_at"]?.stringValue != nil)
        #expect(try salvageCount(daemon) == 1)
        #expect(daemon.log(lastLines: 100_000).contains("salvaged what could be read"))
        return state
    }

    private func taskTotal(_ daemon: DaemonProcess) throws -> Int {
        let counts = try daemon.call("GET", "/v1/info").1["task_counts"]?.objectValue ?? [:]
        return counts.reduce(0) { $0 + Int($1.value.intValue ?? 0) }
    }

    private func salvageCount(_ daemon: DaemonProcess) throws -> Int? {
        let exchange = try HTTPClient().send("GET", daemon.url + "/metrics")
        let text = String(decoding: exchange.body, as: UTF8.self)
        let line = text.split(separator: "\n").first { $0.hasPrefix("backhaul_state_salvaged_total ") }
        return line.flatMap { Int($0.split(separator: " ")[1]) }
    }

    private func corruptDirectories(_ fixture: Fixture) throws -> [String] {
        let directory = fixture.daemon.stateDirectory
        return try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasPrefix("corrupt-") }.sorted()
            .map { directory + "/" + $0 }
    }

    /// The database's size and modification time, and the corrupt-* directories.
    private func stateFiles(_ fixture: Fixture) throws -> [String] {
        var status = stat()
        stat(fixture.daemon.stateDirectory + "/backhaul.db", &status)
        return try ["\(status.st_size) \(status.st_mtim.tv_sec).\(status.st_mtim.tv_nsec)"] + corruptDirectories(fixture)
    }
}
