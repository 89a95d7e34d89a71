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
        // That start skipped the check of every page (a clean stop) and runs it in the background.
        #expect(eventually(timeout: 30) { daemon.log(lastLines: 200).contains("found no damage") }, "\(daemon.log())")
        #expect(try daemon.call("GET", "/v1/info").1["state"]?["damage_found_at"] == .null)
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

    // MARK: Issue 47: a salvage never leaves less than it found; damage never loops

    @Test(
        "a salvage without room for its copy exits 75 and leaves the damaged files as they were, twice; with room, the next start salvages and keeps the tasks",
        .enabled(if: canMountTmpfs, "needs permission to mount a tmpfs"))
    func salvageWithoutRoom() throws {
        let fixture = try Fixture()
        let tasks = 2_010
        _ = try writeState(fixture, tasks: tasks)
        #expect(fixture.daemon.terminate() == 0)
        let lost = try Int(#require(Int(damage(fixture, "table"))))
        // The state directory becomes a tmpfs that holds the damaged files with 256 KiB to spare,
        // less than the salvaged copy needs.
        let state = fixture.daemon.stateDirectory
        let held = fixture.scratch.file("held")
        try FileManager.default.moveItem(atPath: state, toPath: held)
        try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: false)
        let size = try #require(FileManager.default.attributesOfItem(atPath: held + "/backhaul.db")[.size] as? Int)
        try #require(mount("tmpfs", state, "tmpfs", 0, "size=\(size + (256 << 10)),mode=0700") == 0)
        defer { umount2(state, Int32(MNT_DETACH)) }
        for name in try FileManager.default.contentsOfDirectory(atPath: held) {
            try FileManager.default.copyItem(atPath: held + "/" + name, toPath: state + "/" + name)
        }
        let before = try stateFiles(fixture)

        for start in 1...2 {
            #expect(throws: DaemonProcess.DaemonError.self) { try fixture.daemon.start() }
            #expect(fixture.daemon.waitForExit(timeout: 30) == 75, "start \(start): \(fixture.daemon.log(lastLines: 5))")
            #expect(try stateFiles(fixture) == before, "start \(start) changed the damaged files")
            #expect(!FileManager.default.fileExists(atPath: state + "/backhaul.db.salvage"), "the partial copy is removed")
            let log = fixture.daemon.log(lastLines: 5)
            #expect(log.contains("its salvage could not finish") && log.contains("full"), "\(log)")
        }

        try #require(mount("tmpfs", state, "tmpfs", UInt(MS_REMOUNT), "size=\(64 << 20),mode=0700") == 0)
        try fixture.daemon.start()
        let salvaged = try expectSalvaged(fixture.daemon)
        #expect(salvaged["rows_lost"]?.intValue == Int64(lost))
        #expect(try taskTotal(fixture.daemon) == tasks - lost)
        #expect(fixture.daemon.terminate() == 0)
    }

    @Test("a page of tasks damaged after a clean stop, the file's time kept: the next start salvages in that same start")
    func damageAfterCleanStop() throws {
        let fixture = try Fixture()
        _ = try writeState(fixture)
        #expect(fixture.daemon.terminate() == 0)
        #expect(FileManager.default.fileExists(atPath: fixture.daemon.stateDirectory + "/clean-stop"))
        let lost = try Int(#require(Int(damage(fixture, "table", keepTime: true))))
        try fixture.daemon.start()
        let state = try expectSalvaged(fixture.daemon)
        #expect(state["rows_lost"]?.intValue == Int64(lost))
        #expect(try taskTotal(fixture.daemon) == Self.corruptStateTasks - lost)
        #expect(fixture.daemon.log(lastLines: 100_000).contains("starts again in place"))
        #expect(fixture.daemon.terminate() == 0)
    }

    @Test("the same with --on-corrupt-state refuse: that start exits 65, leaves no clean-stop mark, and so does the next")
    func damageAfterCleanStopRefused() throws {
        let fixture = try Fixture(daemonArguments: ["--on-corrupt-state", "refuse"])
        _ = try writeState(fixture)
        #expect(fixture.daemon.terminate() == 0)
        _ = try damage(fixture, "table", keepTime: true)
        for start in 1...2 {
            #expect(throws: DaemonProcess.DaemonError.self) { try fixture.daemon.start() }
            #expect(fixture.daemon.waitForExit() == 65, "start \(start): \(fixture.daemon.log(lastLines: 5))")
            #expect(!FileManager.default.fileExists(atPath: fixture.daemon.stateDirectory + "/clean-stop"))
            #expect(try corruptDirectories(fixture).isEmpty)
        }
    }

    @Test(
        "a page of events damaged after a clean stop: the daemon runs, the background check finds it, /v1/info, the metric and the log report it, and the next start salvages"
    )
    func eventsDamageFoundWhileRunning() throws {
        let fixture = try Fixture()
        _ = try writeState(fixture)
        #expect(fixture.daemon.terminate() == 0)
        let lost = try Int(#require(Int(damage(fixture, "events", keepTime: true))))
        #expect(lost > 0)
        try fixture.daemon.start()
        var state = JSON.null
        let found = try eventually(timeout: 30, interval: 0.2) {
            state = try fixture.daemon.call("GET", "/v1/info").1["state"] ?? .null
            return state["damage_found_at"]?.stringValue != nil
        }
        fixture.expectLog(found, "no damage reported: \(state.serialized())")
        #expect(state["damage"]?.stringValue?.isEmpty == false)
        #expect(state["salvaged_at"] == .null, "nothing was salvaged at this start")
        let metrics = String(decoding: try HTTPClient().send("GET", fixture.daemon.url + "/metrics").body, as: UTF8.self)
        #expect(metrics.contains("\nbackhaul_state_damaged 1"), "the metric")
        #expect(fixture.daemon.log(lastLines: 100_000).contains("the state database is damaged"))
        let page = try BrowserRun("notice", fixture.daemon.url + "/", ["--contains", "The state database is damaged"])
        #expect(page.status == 0, "dashboard: \(page.output)")
        // A store that found damage leaves no clean-stop mark: the next start reads every page.
        #expect(fixture.daemon.terminate() == 0)
        #expect(!FileManager.default.fileExists(atPath: fixture.daemon.stateDirectory + "/clean-stop"))
        try fixture.daemon.start()
        let salvaged = try expectSalvaged(fixture.daemon)
        #expect(salvaged["damage_found_at"] == .null, "\(salvaged.serialized())")
        #expect(try taskTotal(fixture.daemon) == Self.corruptStateTasks)
        #expect(fixture.daemon.terminate() == 0)
    }

    // MARK: Helpers

    /// A session whose tasks (1,500 unless told) wait (cellular, not allowed), and a webhook whose
    /// receiver is away, so its deliveries stay undelivered. Returns the webhook.
    private func writeState(_ fixture: Fixture, tasks count: Int = corruptStateTasks) throws -> JSON {
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "cellular"]).0 == 200)
        try fixture.session("s1", ["allows_cellular_access": false])
        let webhook = try fixture.subscribe("http://127.0.0.1:\(try freePort())/hook")
        let file = fixture.makeFile("a.bin", size: 100)
        for batch in 0..<3 {
            let tasks = (0..<count / 3).map { index -> JSON in
                [
                    "file": .string(file), "description": .string("task \(batch)-\(index) " + String(repeating: "x", count: 100)),
                    "request": ["url": .string(fixture.sink.url("/u/\(batch)/\(index)")), "method": "PUT"],
                ]
            }
            let (status, body) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", ["tasks": .array(tasks)])
            try #require(status == 201, "\(body.serialized())")
        }
        #expect(try taskTotal(fixture.daemon) == count / 3 * 3)
        return webhook
    }

    /// Damages the stopped daemon's state (python3's sqlite3 finds the pages through `dbstat`):
    /// "table" writes random bytes over two leaf pages of `tasks` and prints how many rows they
    /// held; "index" over a leaf page of `tasks_by_session`; "wal" over the WAL's 32-byte header
    /// and prints the WAL's size; "truncate" cuts the database to 60 % of its pages; "events" over
    /// a leaf page of `events` and prints how many rows it held. `keepTime`: the file keeps its
    /// modification time, as a page rotting on disk would.
    private func damage(_ fixture: Fixture, _ mode: String, keepTime: Bool = false) throws -> String {
        let script = """
            import os, random, sqlite3, sys
            mode, path, keep = sys.argv[1], sys.argv[2], sys.argv[3] == "keep"
            before = os.stat(path)
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
            elif mode == "events":
                pages = leaves("events")
                hit = [pages[len(pages) // 2]]
            db.close()
            if mode == "truncate":
                os.truncate(path, size * (count * 6 // 10))
                print(0); sys.exit(0)
            with open(path, "r+b") as f:
                for page, cells in hit:
                    f.seek((page - 1) * size); f.write(garbage(size))
            if keep: os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
            print(sum(cells for _, cells in hit))
            """
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [
            "python3", "-c", script, mode, fixture.daemon.stateDirectory + "/backhaul.db", keepTime ? "keep" : "",
        ]
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
