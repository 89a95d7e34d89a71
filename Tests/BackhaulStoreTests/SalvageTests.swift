import BackhaulCore
import BackhaulTesting
import Glibc
import SQLite
import Testing
import Threads

@testable import BackhaulQueue
@testable import BackhaulSQLite

/// The row copy of a salvage (`StoreSalvage`), on a real state file with a page of garbage.
@Suite("Store salvage")
struct SalvageTests {
    @Test("a page of garbage in the events table: every other row copied, the lost ones counted, the sequence kept")
    func copiesAroundADamagedPage() throws {
        let directory = TemporaryDirectory("backhaul-salvage")
        let path = directory.file("backhaul.db")
        let count = 2_000
        try Self.writeEvents(path, count: count)
        let lost = try Self.damageEventsPage(path)

        let damage = try #require(try StoreSalvage.damage(path: path))
        let report = try StoreSalvage.salvage(path: path, reason: damage, now: 1_800_000_000)
        let events = try #require(report.tables.first { $0.name == "events" })
        #expect(events.copied == count - lost.count)
        #expect(events.lost == lost.count)
        #expect(report.rowsLost == lost.count)
        #expect(report.tables.first { $0.name == "sessions" }?.copied == 1)
        #expect(report.directory == directory.file("corrupt-20270115T080000Z"))
        #expect(access(report.directory + "/backhaul.db", F_OK) == 0)

        let fresh = try Connection(path: path, readOnly: true)
        let seqs = try fresh.query("SELECT seq FROM events ORDER BY seq") { Int($0.int(0)) }
        #expect(seqs == Array(1..<lost.lowerBound) + Array(lost.upperBound...count))
        #expect(try fresh.queryFirst("SELECT seq FROM sqlite_sequence WHERE name = 'events'") { Int($0.int(0)) } == count)
        #expect(try fresh.query("PRAGMA integrity_check") { $0.string(0) } == ["ok"])
        // The store opens the fresh state as sound, and shows the salvage it finds beside it.
        let store = try Store(path: path)
        #expect(store.salvage?.rowsLost == lost.count && store.salvage?.isNew == false)
        store.close()
    }

    @Test("a salvage that cannot build its copy throws and leaves the damaged files where they were")
    func unfinishedSalvage() throws {
        let directory = TemporaryDirectory("backhaul-salvage")
        let path = directory.file("backhaul.db")
        try Self.writeEvents(path, count: 500)
        _ = try Self.damageEventsPage(path)
        let before = try #require(CleanStop.fingerprint(of: path))
        // The name the copy is built under is taken by a directory: the build fails.
        #expect(mkdir(StoreSalvage.buildingPath(for: path), 0o700) == 0)
        #expect(throws: SalvageFailure.self) { try StoreSalvage.examine(path: path, policy: .salvage, now: 1_800_000_000) }
        #expect(CleanStop.fingerprint(of: path) == before)
        #expect(StoreSalvage.entries(of: directory.path).filter { $0.hasPrefix("corrupt-") }.isEmpty)
        // With the name free, the next attempt salvages.
        #expect(rmdir(StoreSalvage.buildingPath(for: path)) == 0)
        let report = try #require(try StoreSalvage.examine(path: path, policy: .salvage, now: 1_800_000_000))
        #expect(report.rowsCopied > 0 && report.isNew)
        let folder = StoreSalvage.baseName(of: report.directory)
        #expect(StoreSalvage.entries(of: directory.path).sorted() == ["backhaul.db", folder].sorted(), "nothing built is left")
    }

    @Test(
        "after a clean stop the open skips the page check and runs it in the background: a damaged page of a table or an index is found, and no clean-stop mark is left",
        arguments: ["events", "events_by_session"])
    func backgroundCheck(damaged: String) throws {
        let directory = TemporaryDirectory("backhaul-salvage")
        let path = directory.file("backhaul.db")
        try Self.writeEvents(path, count: 2_000)
        try Store(path: path).close()
        #expect(access(CleanStop.path(beside: path), F_OK) == 0)
        _ = try Self.damageEventsPage(path, of: damaged, keepTime: true)
        let found = Locked<[StateDamage]>([])
        let store = try Store(path: path, onCorruptState: .salvage) { incident in
            if case .damaged(let damage) = incident { found.withLock { $0.append(damage) } }
        }
        #expect(store.salvage == nil, "the open skipped the page check")
        #expect(eventually(timeout: 20) { store.damage != nil }, "the background check found nothing")
        #expect(store.damage?.foundBy == "the background check")
        #expect(store.damage?.reason.contains("events") == true, "\(String(describing: store.damage))")
        #expect(found.withLock { $0 } == [store.damage].compactMap { $0 })
        store.close()
        #expect(access(CleanStop.path(beside: path), F_OK) != 0, "a store that found damage left a clean-stop mark")
        let next = try Store(path: path, onCorruptState: .salvage)
        #expect(next.salvage?.isNew == true)
        next.close()
    }

    @Test("a store opened for a start leaves no clean-stop mark until the start completed")
    func failedStartLeavesNoMark() throws {
        let directory = TemporaryDirectory("backhaul-salvage")
        let path = directory.file("backhaul.db")
        try Store(path: path, awaitingStart: true).close()
        #expect(access(CleanStop.path(beside: path), F_OK) != 0)
        let store = try Store(path: path, awaitingStart: true)
        store.started()
        store.close()
        #expect(access(CleanStop.path(beside: path), F_OK) == 0)
    }

    @Test(
        "a salvage cut off between removing the damaged log and its rename: the next one links the log back and keeps what it held"
    )
    func interruptedSwap() throws {
        let directory = TemporaryDirectory("backhaul-salvage")
        let written = directory.file("written.db")
        try Self.writeEvents(written, count: 1_000)
        // A database whose WAL holds a commit (session s2) the file does not: copied while the
        // connection that wrote it is open, before its close copies the log back.
        let path = directory.file("backhaul.db")
        do {
            let db = try Connection(path: written)
            try db.execute("PRAGMA wal_autocheckpoint = 0")
            try db.run("INSERT INTO sessions (id, configuration, created_at) VALUES ('s2', '{}', 2)")
            try StoreSalvage.copyFile(written, to: path)
            try StoreSalvage.copyFile(written + "-wal", to: path + "-wal")
        }
        _ = try Self.damageEventsPage(path)
        // The salvage's steps up to the rename, as a power cut would leave them.
        _ = try StoreSalvage.keepDamaged(path: path, now: 1_800_000_000)
        for ending in ["-wal", "-shm"] { unlink(path + ending) }

        let report = try #require(try StoreSalvage.examine(path: path, policy: .salvage, now: 1_800_000_100))
        #expect(report.tables.first { $0.name == "sessions" }?.copied == 2, "the commit in the log is kept")
        let folders = StoreSalvage.entries(of: directory.path).filter { $0.hasPrefix("corrupt-") }
        #expect(folders == [StoreSalvage.baseName(of: report.directory)], "the cut-off salvage's directory is gone")
        #expect(access(report.directory + "/backhaul.db-wal", F_OK) == 0)
    }

    @Test("a sound state is left alone; refuse names the damage")
    func soundAndRefused() throws {
        let directory = TemporaryDirectory("backhaul-salvage")
        let path = directory.file("backhaul.db")
        try Store(path: path).close()
        #expect(try StoreSalvage.examine(path: path, policy: .salvage, now: 0) == nil)
        let descriptor = open(path, O_WRONLY)
        #expect(pwrite(descriptor, [UInt8](repeating: 0x55, count: 100), 100, 0) == 100)
        close(descriptor)
        #expect(throws: StoreError.self) { try StoreSalvage.examine(path: path, policy: .refuse, now: 0) }
        #expect(access(path, F_OK) == 0)
    }

    /// A state with `count` events of session s1, its WAL copied back.
    static func writeEvents(_ path: String, count: Int) throws {
        try Store(path: path).close()
        unlink(CleanStop.path(beside: path))
        let db = try Connection(path: path)
        try db.transaction {
            try db.run("INSERT INTO sessions (id, configuration, created_at) VALUES ('s1', '{}', 1)")
            for seq in 1...count {
                try db.run(
                    "INSERT INTO events (seq, id, type, session_id, created_at, data) VALUES (?, ?, 'task.created', 's1', ?, ?)",
                    [seq, "evt_\(seq)", Double(seq), String(repeating: "d", count: 200)])
            }
        }
        _ = try db.checkpoint(.truncate)
    }

    /// Writes garbage over the middle leaf page of `events` (or of the index `of` names); returns
    /// the seqs it held (of `events`). `keepTime`: the file keeps its modification time (and so its
    /// clean-stop mark still describes it).
    static func damageEventsPage(_ path: String, of name: String = "events", keepTime: Bool = false) throws -> Range<Int> {
        var before = stat()
        stat(path, &before)
        // The leaf pages of `events` in key order, with the keys each holds.
        let db = try Connection(path: path, readOnly: true)
        let leaves = try db.query("SELECT pageno, ncell FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY path", [name]) {
            (Int($0.int(0)), Int($0.int(1)))
        }
        try #require(leaves.count > 1, "\(name) has one leaf page")
        let pageSize = try #require(try db.queryFirst("PRAGMA page_size") { Int($0.int(0)) })
        let hit = leaves.count / 2
        let firstLost = leaves[..<hit].reduce(0) { $0 + $1.1 } + 1
        let descriptor = open(path, O_WRONLY)
        let garbage = (0..<pageSize).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ 7) }
        #expect(pwrite(descriptor, garbage, pageSize, off_t((leaves[hit].0 - 1) * pageSize)) == pageSize)
        if keepTime {
            let times = [before.st_atim, before.st_mtim]
            #expect(futimens(descriptor, times) == 0)
        }
        close(descriptor)
        return firstLost..<(firstLost + leaves[hit].1)
    }
}
