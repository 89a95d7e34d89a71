import BackhaulCore
import BackhaulTesting
import Foundation
import Glibc
import SQLite
import Testing
import Threads

@testable import BackhaulQueue
@testable import BackhaulSQLite

/// When a checkpoint is due and when it runs, as tables of events (`CheckpointSchedule` is pure:
/// the time is given).
@Suite("Checkpoint schedule")
struct CheckpointScheduleTests {
    /// One event of a scenario, with what it must give.
    enum Event {
        /// A commit (the engine's: not synced) left `frames` in the log; whether that wakes the
        /// checkpointer.
        case commit(frames: Int, at: Double, wakes: Bool)
        /// A synced commit left `frames` in the log; whether the writer copies it back at once.
        case synced(frames: Int, at: Double, here: Bool)
        /// What is due at a time.
        case next(at: Double, CheckpointSchedule.Step)
        case finished(CheckpointOutcome, at: Double)
        case uncopied(Int)
    }

    private func play(_ events: [Event], sourceLocation: SourceLocation = #_sourceLocation) {
        var policy = WALPolicy()
        policy.pauseFrames = 100
        policy.pauseSeconds = 0.25
        var schedule = CheckpointSchedule(policy: policy)
        for (index, event) in events.enumerated() {
            switch event {
            case .commit(let frames, let time, let wakes):
                let step = schedule.committed(frames: frames, synced: false, at: time)
                #expect(step == (wakes ? .wake : .none), "event \(index): \(frames) frames", sourceLocation: sourceLocation)
            case .synced(let frames, let time, let here):
                let step = schedule.committed(frames: frames, synced: true, at: time)
                #expect((step == .checkpointHere) == here, "event \(index): \(step)", sourceLocation: sourceLocation)
            case .next(let time, let expected):
                let step = schedule.next(at: time)
                if case .wait(let seconds?) = step, case .wait(let wanted?) = expected {
                    #expect(abs(seconds - wanted) < 1e-9, "event \(index): waits \(seconds) s", sourceLocation: sourceLocation)
                } else {
                    #expect(step == expected, "event \(index)", sourceLocation: sourceLocation)
                }
            case .finished(let outcome, let time):
                schedule.finished(outcome, at: time)
            case .uncopied(let frames):
                #expect(schedule.uncopied == frames, "event \(index)", sourceLocation: sourceLocation)
            }
        }
    }

    @Test("below pauseFrames nothing is due, and no commit wakes the checkpointer")
    func belowThreshold() {
        play([
            .commit(frames: 10, at: 0, wakes: false), .commit(frames: 99, at: 1, wakes: false),
            .next(at: 100, .wait(nil)),
        ])
    }

    @Test("past pauseFrames one is due at the pause, which each commit moves on; the first such commit wakes")
    func atThePause() {
        play([
            .commit(frames: 150, at: 0, wakes: true), .next(at: 0.1, .wait(0.15)),
            .commit(frames: 160, at: 0.2, wakes: false), .next(at: 0.3, .wait(0.15)),
            .next(at: 0.45, .passive), .finished(.ran(frames: 160, copied: 160), at: 0.5), .uncopied(0),
            .next(at: 10, .wait(nil)),
        ])
    }

    @Test("after a synced commit past pauseFrames the writer copies the log back at once, and not while one runs")
    func afterSynced() {
        play([
            .synced(frames: 50, at: 0, here: false), .synced(frames: 120, at: 0.01, here: true),
            .synced(frames: 130, at: 0.02, here: false), .finished(.ran(frames: 120, copied: 120), at: 0.03),
            .uncopied(10), .synced(frames: 20, at: 0.04, here: false), .uncopied(20),
            .synced(frames: 125, at: 0.05, here: true), .finished(.busy, at: 0.06),
            .synced(frames: 130, at: 0.1, here: false), .synced(frames: 140, at: 0.32, here: true),
        ])
    }

    @Test("writes that never pause get no checkpoint from the schedule (the writer's cap is theirs)")
    func neverPausing() {
        var events: [Event] = []
        for step in 0..<100 {
            let now = Double(step) * 0.1
            events.append(.commit(frames: 100 + step * 50, at: now, wakes: step == 0))
            events.append(.next(at: now + 0.05, .wait(0.2)))
        }
        events.append(.next(at: 9.9 + 0.25, .passive))
        play(events)
    }

    @Test("a log that started over counts from nothing")
    func logStartsOver() {
        play([
            .commit(frames: 500, at: 0, wakes: true), .next(at: 0.3, .passive),
            .finished(.ran(frames: 500, copied: 500), at: 0.31), .uncopied(0),
            .commit(frames: 40, at: 1, wakes: false), .uncopied(40), .next(at: 2, .wait(nil)),
            .commit(frames: 140, at: 2, wakes: true), .uncopied(140), .next(at: 2.25, .passive),
        ])
    }

    @Test("a checkpoint's figures of a log that started over since are not this log's")
    func staleResult() {
        play([
            .commit(frames: 500, at: 0, wakes: true), .next(at: 0.3, .passive),
            .commit(frames: 120, at: 0.31, wakes: false), .finished(.ran(frames: 500, copied: 500), at: 0.32),
            .uncopied(120), .next(at: 0.56, .passive),
        ])
    }

    @Test("one that readers held back, or that was busy, is tried again after a pause, not at once")
    func heldBack() {
        play([
            .commit(frames: 300, at: 0, wakes: true), .next(at: 0.25, .passive),
            .finished(.ran(frames: 300, copied: 100), at: 0.3), .uncopied(200), .next(at: 0.4, .wait(0.15)),
            .next(at: 0.55, .passive), .finished(.busy, at: 0.6), .next(at: 0.7, .wait(0.15)),
            .next(at: 0.85, .passive), .finished(.ran(frames: 300, copied: 300), at: 0.9), .next(at: 5, .wait(nil)),
        ])
    }

    @Test("one that failed is tried again later each time, up to the longest wait, and at the pause once one ran")
    func failedBacksOff() {
        play([
            .commit(frames: 300, at: 0, wakes: true), .next(at: 0.25, .passive),
            .finished(.failed, at: 1), .next(at: 1, .wait(0.25)), .next(at: 1.25, .passive),
            .finished(.failed, at: 2), .next(at: 2, .wait(0.5)), .next(at: 2.5, .passive),
            .finished(.failed, at: 3), .next(at: 3, .wait(1)), .next(at: 4, .passive),
            .finished(.ran(frames: 300, copied: 100), at: 4), .next(at: 4, .wait(0.25)), .next(at: 4.25, .passive),
            .finished(.failed, at: 5), .next(at: 5, .wait(0.25)),
        ])
    }

    @Test("failures wait at most maxRetrySeconds")
    func failedCapped() {
        var events: [Event] = [.commit(frames: 300, at: 0, wakes: true)]
        var now = 0.25
        for _ in 0..<12 {
            events.append(.next(at: now, .passive))
            events.append(.finished(.failed, at: now))
            now += 40
        }
        events.append(.next(at: now - 40, .wait(CheckpointSchedule.maxRetrySeconds)))
        play(events)
    }
}

/// The checkpointer copies the WAL back once the writes pause, and the writer never waits for it;
/// at the cap the writer empties the log itself. The writes here are relaxed ones, as the engine's
/// are: a row of 3,000 bytes each, a frame or two.
@Suite("WAL checkpoints")
struct CheckpointTests {
    private func withStore(_ policy: WALPolicy, _ body: (Store, String) throws -> Void) throws {
        let path = "/tmp/backhaul-ckpt-\(getpid())-\(RandomID.make(prefix: "", at: 0)).db"
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        let store = try Store(path: path, walPolicy: policy)
        defer { store.close() }
        try body(store, path)
    }

    /// One relaxed write, as the engine's are (the first makes its table).
    private func relaxedWrite(_ store: Store) throws {
        try store.write(.relaxed) { db in
            try db.execute("CREATE TABLE IF NOT EXISTS filler (bytes BLOB)")
            try db.run("INSERT INTO filler VALUES (randomblob(3000))")
        }
    }

    /// Relaxed writes until the log holds at least `frames` frames (at most 10,000 of them).
    private func write(_ store: Store, untilFrames frames: Int) throws {
        var count = 0
        while store.maintenanceFigures.walFrames < frames && count < 10_000 {
            try relaxedWrite(store)
            count += 1
        }
        #expect(store.maintenanceFigures.walFrames >= frames, "the log never reached \(frames) frames")
    }

    @Test("a burst's log is copied back once the writes pause, and the next write starts it again in place")
    func atPause() throws {
        var policy = WALPolicy()
        policy.pauseFrames = 40
        policy.pauseSeconds = 1
        try withStore(policy) { store, path in
            try write(store, untilFrames: 80)
            let frames = store.maintenanceFigures.walFrames
            let size = fileSize(path + "-wal")
            #expect(store.maintenanceFigures.passiveCheckpoints == 0, "a checkpoint ran before the writes paused")
            #expect(eventually(timeout: 10) { store.maintenanceFigures.passiveCheckpoints >= 1 })
            #expect(store.maintenanceFigures.checkpointsBusy == 0)
            try relaxedWrite(store)
            #expect(store.maintenanceFigures.walFrames < frames / 2, "the log did not start again after the checkpoint")
            #expect(fileSize(path + "-wal") == size, "the log's file was not rewritten in place")
        }
    }

    @Test("writes that never pause are held at the cap by the writer's TRUNCATE, and get no checkpoint before it")
    func atTheCap() throws {
        var policy = WALPolicy()
        policy.pauseFrames = 40
        policy.pauseSeconds = 3600
        policy.capFrames = 300
        try withStore(policy) { store, path in
            var largest = 0
            for _ in 0..<1000 {
                try relaxedWrite(store)
                largest = max(largest, fileSize(path + "-wal"))
            }
            let figures = store.maintenanceFigures
            #expect(figures.passiveCheckpoints == 0)
            #expect(figures.truncateCheckpoints >= 2, "\(figures.truncateCheckpoints) TRUNCATE checkpoints")
            #expect(largest <= 32 + (policy.capFrames + 10) * (24 + 4096), "the log reached \(largest) bytes")
            #expect(figures.checkpointErrors == 0)
        }
    }

    @Test("a clean close copies the whole log back: the database file alone holds the state")
    func closeEmptiesTheLog() throws {
        let path = "/tmp/backhaul-ckpt-close-\(getpid()).db"
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        let store = try Store(path: path)
        for _ in 0..<200 { try relaxedWrite(store) }
        store.close()
        #expect(fileSize(path + "-wal") <= 0, "the log still held \(fileSize(path + "-wal")) bytes")
        // The database file on its own, as a backup of it alone would be.
        let copy = path + ".alone"
        defer { unlink(copy) }
        #expect(copyFile(path, to: copy))
        let db = try Connection(path: copy)
        #expect(try db.queryFirst("SELECT count(*) FROM filler") { $0.int(0) } == 200)
        #expect(try db.queryFirst("PRAGMA integrity_check") { $0.string(0) } == "ok")
    }

    @Test(
        "a clean close leaves the clean-stop mark for the database as it is; the next open takes it, and a changed file is not taken for clean"
    )
    func cleanStopMark() throws {
        let directory = TemporaryDirectory("backhaul-clean-stop")
        let path = directory.file("backhaul.db")
        let marker = directory.file(CleanStop.name)
        let store = try Store(path: path)
        try relaxedWrite(store)
        store.close()
        #expect(fileSize(marker) > 0, "no mark after a clean close")
        #expect(try CleanStop.take(beside: path))
        #expect(fileSize(marker) == -1, "the mark stayed after it was taken")
        #expect(try !CleanStop.take(beside: path), "a state with no mark was taken for a clean stop")
        // A write to the file after the mark (a tool, a damaged restore) makes it count as unclean.
        let again = try Store(path: path)
        again.close()
        let db = try Connection(path: path)
        try db.execute("PRAGMA user_version = user_version")
        try db.execute("CREATE TABLE later (x); DROP TABLE later")
        _ = try db.checkpoint(.truncate)
        #expect(try !CleanStop.take(beside: path), "a database changed after the mark was taken for a clean stop")
    }

    @Test("the writes are not held by a checkpoint that runs")
    func besideTheWriter() throws {
        var policy = WALPolicy()
        policy.pauseFrames = 40
        policy.pauseSeconds = 0.05
        try withStore(policy) { store, _ in
            try write(store, untilFrames: 80)
            // The checkpoint, once the writes paused, is held until the writes below went through.
            let gate = Locked((entered: false, open: false))
            store.checkpointer.beforeCheckpoint.withLock { hook in
                hook = {
                    gate.withLockNotifyingAll { $0.entered = true }
                    gate.withLock(when: { $0.open }) { _ in }
                }
            }
            #expect(gate.wait(until: { $0.entered }, timeout: 10) { $0.entered }, "no checkpoint began at the pause")
            // The writes run on a thread of their own, so that a writer held by the checkpoint
            // fails the test instead of hanging it.
            let written = Locked<Result<Int, any Error>?>(nil)
            Thread.detachNewThread {
                let result = Result { () throws -> Int in
                    for _ in 0..<20 { try relaxedWrite(store) }
                    return 20
                }
                written.withLockNotifyingAll { $0 = result }
            }
            let result = written.wait(until: { $0 != nil }, timeout: 10) { $0 }
            #expect((try? result?.get()) == 20, "the writes waited for the checkpoint")
            gate.withLockNotifyingAll { $0.open = true }
            if result == nil { _ = written.wait(until: { $0 != nil }, timeout: 60) { $0 } }
        }
    }
}

func fileSize(_ path: String) -> Int {
    var info = stat()
    return stat(path, &info) == 0 ? Int(info.st_size) : -1
}

func copyFile(_ source: String, to destination: String) -> Bool {
    guard let data = FileManager.default.contents(atPath: source) else { return false }
    return FileManager.default.createFile(atPath: destination, contents: data)
}
