import BackhaulCore
import BackhaulTesting
import Glibc
import SQLite
import Testing

@testable import BackhaulStore

/// The row copy of a salvage (`StoreSalvage`), on a real state file with a page of garbage.
@Suite("Store salvage")
struct SalvageTests {
    @Test("a page of garbage in the events table: every other row copied, the lost ones counted, the sequence kept")
    func copiesAroundADamagedPage() throws {
        let directory = TemporaryDirectory("backhaul-salvage")
        let path = directory.file("backhaul.db")
        try Store(path: path).close()
        let count = 2_000
        do {
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
        // The leaf pages of `events` in key order, with the keys each holds.
        let db = try Connection(path: path, readOnly: true)
        let leaves = try db.query("SELECT pageno, ncell FROM dbstat WHERE name = 'events' AND pagetype = 'leaf' ORDER BY path") {
            (Int($0.int(0)), Int($0.int(1)))
        }
        let pageSize = try #require(try db.queryFirst("PRAGMA page_size") { Int($0.int(0)) })
        let hit = leaves.count / 2
        let firstLost = leaves[..<hit].reduce(0) { $0 + $1.1 } + 1
        let lost = firstLost..<(firstLost + leaves[hit].1)
        let descriptor = open(path, O_WRONLY)
        let garbage = (0..<pageSize).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ 7) }
        #expect(pwrite(descriptor, garbage, pageSize, off_t((leaves[hit].0 - 1) * pageSize)) == pageSize)
        close(descriptor)

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
}
