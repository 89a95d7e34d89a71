import BackhaulCore
import BackhaulTesting
import Glibc
import SQLite
import Testing
import Threads

@testable import BackhaulQueue
@testable import BackhaulSQLite

/// A batch's jobs are told the truth (docs/operations.md, "The state on disk"): each one told it
/// succeeded is in the database, each one told it failed is not. A job that fails with an error
/// after which SQLite rolled the whole transaction back (SQLITE_FULL here, on a 2 MiB tmpfs) takes
/// the batch with it: no job runs after it outside the transaction, and every job is told it failed.
@Suite("Group commit", .serialized)
struct GroupCommitTests {
    /// One job's SQL and its outcome.
    private struct Outcome: Sendable {
        let name: String
        let error: StoreError?
    }

    /// Runs `jobs` (a name and the SQL each runs) in one batch of `store`'s writer; their outcomes
    /// in order.
    private func batch(_ store: Store, _ jobs: [(String, String)]) -> [Outcome] {
        let outcomes = Locked<[Outcome]>([])
        store.holdWrites()
        for (name, sql) in jobs {
            store.writer.submit(
                StoreWriter.Job(
                    durable: true, body: { db, _ in try db.execute(sql) },
                    done: { error in outcomes.withLockNotifyingAll { $0.append(Outcome(name: name, error: error)) } }))
        }
        store.releaseWrites()
        return outcomes.wait(until: { $0.count == jobs.count }, timeout: 30) { $0 }
    }

    private func rows(_ store: Store, _ name: String) throws -> Int {
        try store.read { db in try db.queryFirst("SELECT count(*) FROM marks WHERE name = ?", [name]) { Int($0.int(0)) } ?? 0 }
    }

    private func prepare(_ store: Store) throws {
        try store.write { db in
            try db.execute("CREATE TABLE marks (name TEXT PRIMARY KEY); CREATE TABLE filler (bytes BLOB)")
            try db.run("INSERT INTO marks VALUES ('taken')")
        }
    }

    @Test("a constraint error undoes its own job only; the others are committed and told so")
    func constraintError() throws {
        let directory = TemporaryDirectory("backhaul-group")
        let store = try Store(path: directory.file("state.db"))
        defer { store.close() }
        try prepare(store)
        let outcomes = batch(
            store,
            [
                ("a", "INSERT INTO marks VALUES ('a')"), ("taken", "INSERT INTO marks VALUES ('taken')"),
                ("c", "INSERT INTO marks VALUES ('c')"),
            ])
        #expect(outcomes.map(\.name) == ["a", "taken", "c"])
        #expect(outcomes[0].error == nil && outcomes[2].error == nil)
        #expect(outcomes[1].error != nil)
        #expect(try rows(store, "a") == 1 && rows(store, "c") == 1 && rows(store, "taken") == 1)
    }

    @Test("a job that fills the disk rolls the whole batch back, and every job of it is told it failed")
    func diskFullMidBatch() throws {
        let mountPoint = TemporaryDirectory("backhaul-full")
        try #require(
            mount("tmpfs", mountPoint.path, "tmpfs", 0, "size=2m") == 0,
            "cannot mount a 2 MiB tmpfs (root is needed): \(String(cString: strerror(errno)))")
        defer { umount2(mountPoint.path, Int32(MNT_DETACH)) }
        let store = try Store(path: mountPoint.file("state.db"))
        defer { store.close() }
        try prepare(store)
        // A constraint error first, so the batch runs again with a savepoint a job; then a job
        // that needs more than the disk holds, and one after it.
        let outcomes = batch(
            store,
            [
                ("a", "INSERT INTO marks VALUES ('a')"), ("taken", "INSERT INTO marks VALUES ('taken')"),
                ("big", "INSERT INTO filler VALUES (randomblob(8 * 1024 * 1024)); INSERT INTO marks VALUES ('big')"),
                ("c", "INSERT INTO marks VALUES ('c')"),
            ])
        #expect(outcomes.count == 4)
        for outcome in outcomes {
            let stored = try rows(store, outcome.name)
            if outcome.name == "taken" { continue }
            // The truth: told it succeeded if and only if it is stored.
            #expect(
                (outcome.error == nil) == (stored == 1),
                "\(outcome.name): told \(outcome.error.map { "\($0)" } ?? "ok"), \(stored) stored")
        }
        #expect(outcomes.first { $0.name == "big" }?.error == .storageFull)
        // SQLite rolled the transaction back whole: nothing of the batch is there, and no job was
        // told it succeeded (the last one had committed on its own, outside the transaction).
        #expect(try rows(store, "c") == 0 && rows(store, "a") == 0)
        #expect(outcomes.allSatisfy { $0.error != nil })
        // The store goes on once there is room.
        let after = batch(store, [("d", "INSERT INTO marks VALUES ('d')")])
        #expect(after.first?.error == nil)
        #expect(try rows(store, "d") == 1)
    }
}
