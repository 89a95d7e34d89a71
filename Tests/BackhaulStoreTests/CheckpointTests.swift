import BackhaulCore
import BackhaulTesting
import Foundation
import Glibc
import SQLite
import Testing
import Threads

@testable import BackhaulStore

/// When a checkpoint is due and when it runs, as tables of events (`CheckpointSchedule` is pure:
/// the time is given).
@Suite("Checkpoint schedule")
struct CheckpointScheduleTests {
    /// One event of a scenario, with what it must give.
    enum Event {
        /// A commit left `frames` in the log begun `log` times (synced, or not: the engine's);
        /// whether that wakes the checkpointer.
        case commit(frames: Int, log: Int, synced: Bool = false, at: Double, wakes: Bool)
        /// A commit after which the writer copies the log back itself.
        case commitAndCheckpoint(frames: Int, log: Int, synced: Bool = false, at: Double)
        /// What is due at a time.
        case next(at: Double, CheckpointSchedule.Step)
        case finished((frames: Int, copied: Int)?, at: Double)
        case uncopied(Int)
    }

    private func play(_ events: [Event], sourceLocation: SourceLocation = #_sourceLocation) {
        var policy = WALPolicy()
        policy.passiveFrames = 100
        policy.pauseSeconds = 0.25
        policy.busyFrames = 1000
        policy.truncateFrames = 2000
        var schedule = CheckpointSchedule(policy: policy)
        for (index, event) in events.enumerated() {
            switch event {
            case .commit(let frames, let log, let synced, let time, let wakes):
                let step = schedule.committed(frames: frames, log: log, synced: synced, at: time)
                #expect(step == (wakes ? .wake : .none), "event \(index): \(frames) frames", sourceLocation: sourceLocation)
            case .commitAndCheckpoint(let frames, let log, let synced, let time):
                let step = schedule.committed(frames: frames, log: log, synced: synced, at: time)
                #expect(step == .checkpointHere, "event \(index): \(frames) frames", sourceLocation: sourceLocation)
            case .next(let time, let expected):
                let step = schedule.next(at: time)
                if case .wait(let seconds?) = step, case .wait(let wanted?) = expected {
                    #expect(abs(seconds - wanted) < 1e-9, "event \(index): waits \(seconds) s", sourceLocation: sourceLocation)
                } else {
                    #expect(step == expected, "event \(index)", sourceLocation: sourceLocation)
                }
            case .finished(let result, let time):
                schedule.finished(result, at: time)
            case .uncopied(let frames):
                #expect(schedule.uncopied == frames, "event \(index)", sourceLocation: sourceLocation)
            }
        }
    }

    @Test("below passiveFrames nothing is due, and no commit wakes the checkpointer")
    func belowThreshold() {
        play([
            .commit(frames: 10, log: 1, at: 0, wakes: false), .next(at: 10, .wait(nil)),
            .commit(frames: 99, log: 1, at: 11, wakes: false), .next(at: 20, .wait(nil)),
        ])
    }

    @Test("past passiveFrames one is due at the pause, which each commit moves on")
    func atThePause() {
        play([
            .commit(frames: 60, log: 1, at: 0, wakes: false),
            .commit(frames: 120, log: 1, at: 1, wakes: true),
            .next(at: 1.05, .wait(0.2)),
            .commit(frames: 180, log: 1, at: 1.1, wakes: false),
            .next(at: 1.2, .wait(0.15)),
            .next(at: 1.35, .passive),
            .next(at: 1.4, .wait(nil)),  // one at a time
            .finished((frames: 180, copied: 180), at: 1.4),
            .uncopied(0), .next(at: 5, .wait(nil)),
        ])
    }

    @Test("after a synced commit past passiveFrames the writer copies the log back at once")
    func afterSynced() {
        play([
            .commit(frames: 60, log: 1, synced: true, at: 0, wakes: false),
            .commit(frames: 99, log: 1, synced: true, at: 0.01, wakes: false),
            .commitAndCheckpoint(frames: 130, log: 1, synced: true, at: 0.02),
            .next(at: 0.02, .wait(nil)),  // the writer's is under way
            .finished((frames: 130, copied: 130), at: 0.03),
            .commit(frames: 20, log: 2, synced: true, at: 0.04, wakes: false),
            .uncopied(20),
            // Readers held it back: not again at once, and then after a pause.
            .commit(frames: 140, log: 2, at: 0.05, wakes: true),
            .commitAndCheckpoint(frames: 150, log: 2, synced: true, at: 0.06),
            .finished((frames: 150, copied: 40), at: 0.07),
            .commit(frames: 160, log: 2, synced: true, at: 0.08, wakes: false),
            .next(at: 0.08, .wait(0.25)),
        ])
    }

    @Test("past busyFrames one runs beside the writes, and the writer copies what it left")
    func whileBusy() {
        play([
            .commit(frames: 500, log: 1, at: 0, wakes: true),
            .commit(frames: 1000, log: 1, at: 0.01, wakes: true),  // sooner than the pause
            .next(at: 0.01, .passive),
            .commit(frames: 1050, log: 1, at: 0.02, wakes: false),  // none while one runs
            .finished((frames: 1000, copied: 1000), at: 0.03),
            .uncopied(50), .next(at: 0.03, .wait(nil)),
            .commitAndCheckpoint(frames: 1060, log: 1, at: 0.04),
            .commit(frames: 1070, log: 1, at: 0.05, wakes: false),  // none while the writer's runs
            .finished((frames: 1060, copied: 1060), at: 0.06),
            .commit(frames: 5, log: 2, at: 0.07, wakes: false),  // the log started over
            .uncopied(5),
        ])
    }

    @Test("a pass beside the writes that left much is followed by another, not by the writer's")
    func busyLeftMuch() {
        play([
            .commit(frames: 1000, log: 1, at: 0, wakes: true),
            .next(at: 0, .passive),
            .commit(frames: 1400, log: 1, at: 0.1, wakes: false),
            .finished((frames: 1000, copied: 1000), at: 0.11),
            .uncopied(400), .next(at: 0.11, .passive),  // 400 more than when it began
            .finished((frames: 1400, copied: 1400), at: 0.2),
            .commitAndCheckpoint(frames: 1450, log: 1, at: 0.21),
        ])
    }

    /// Readers may keep the log from starting over after the writer copied the rest: the writer
    /// does not then checkpoint after every commit, but after the next checkpoint beside the writes.
    @Test("the writer copies the rest once after each checkpoint beside the writes")
    func restOncePerPass() {
        play([
            .commit(frames: 1000, log: 1, at: 0, wakes: true),
            .next(at: 0, .passive),
            .finished((frames: 1000, copied: 1000), at: 0.01),
            .commitAndCheckpoint(frames: 1020, log: 1, at: 0.02),
            .finished((frames: 1020, copied: 1020), at: 0.03),
            // The log did not start over (a reader): no rest after this commit, nor the next.
            .commit(frames: 1040, log: 1, at: 0.04, wakes: false),
            .commit(frames: 1060, log: 1, at: 0.05, wakes: false),
            .commit(frames: 1120, log: 1, at: 0.06, wakes: true),  // 100 past the writer's
            .next(at: 0.06, .passive),
            .finished((frames: 1120, copied: 1120), at: 0.07),
            .commitAndCheckpoint(frames: 1130, log: 1, at: 0.08),
        ])
    }

    @Test("one that readers held back is not tried again at once")
    func heldBack() {
        play([
            .commit(frames: 1000, log: 1, at: 0, wakes: true),
            .next(at: 0, .passive),
            .finished((frames: 1000, copied: 40), at: 0.01),
            .uncopied(960),
            .commit(frames: 1100, log: 1, at: 0.02, wakes: true),
            .next(at: 0.02, .wait(0.24)),
            .next(at: 0.26, .passive),
        ])
    }

    @Test("a log the writer emptied (TRUNCATE) counts from nothing")
    func emptied() {
        play([
            .commit(frames: 400, log: 1, at: 0, wakes: true),
            .commit(frames: 0, log: 1, at: 0.1, wakes: false),
            .uncopied(0), .next(at: 1, .wait(nil)),
            .commit(frames: 30, log: 2, at: 1.1, wakes: false),
            .uncopied(30),
        ])
    }

    /// The log starts over when a write finds it all copied back. Its frame count alone can hide
    /// that: the first commit into the new log may be as long as the old log was.
    @Test("a log that started over has nothing copied back, however long its first commit")
    func logStartsOver() {
        play([
            .commit(frames: 120, log: 1, at: 0, wakes: true),
            .next(at: 1, .passive),
            .finished((frames: 120, copied: 120), at: 1),
            .commit(frames: 150, log: 2, at: 2, wakes: true),
            .uncopied(150),
            .next(at: 2.25, .passive),
        ])
    }

    @Test("a checkpoint's figures of a log that started over since are not this log's")
    func staleResult() {
        play([
            .commit(frames: 400, log: 1, at: 0, wakes: true),
            .next(at: 1, .passive),
            .commit(frames: 20, log: 2, at: 1.01, wakes: false),
            .finished((frames: 400, copied: 400), at: 1.02),
            .uncopied(20),
        ])
    }

    @Test("a checkpoint that could not run is tried again after a pause")
    func couldNotRun() {
        play([
            .commit(frames: 150, log: 1, at: 0, wakes: true),
            .next(at: 0.3, .passive),
            .finished(nil, at: 0.3),
            .next(at: 0.4, .wait(0.15)),
            .next(at: 0.55, .passive),
        ])
    }
}

/// The checkpointer copies the WAL back after the engine's writes (not synced) when they pause, or
/// past `busyFrames` beside them, and the writer never waits for it. The writes here are such
/// relaxed ones: a row of 3,000 bytes each, a frame or two.
@Suite("WAL checkpoints")
struct CheckpointTests {
    private func withStore(_ policy: WALPolicy, _ body: (Store) throws -> Void) throws {
        let path = "/tmp/backhaul-ckpt-\(getpid())-\(RandomID.make(prefix: "", at: 0)).db"
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        let store = try Store(path: path, walPolicy: policy)
        defer { store.close() }
        try body(store)
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

    @Test("a burst's log is copied back once the writes pause, and the next write starts it again")
    func atPause() throws {
        var policy = WALPolicy()
        policy.passiveFrames = 40
        policy.pauseSeconds = 1
        policy.busyFrames = .max
        policy.truncateFrames = .max
        try withStore(policy) { store in
            try write(store, untilFrames: 80)
            let frames = store.maintenanceFigures.walFrames
            #expect(store.maintenanceFigures.passiveCheckpoints == 0, "a checkpoint ran before the writes paused")
            #expect(eventually(timeout: 10) { store.maintenanceFigures.passiveCheckpoints >= 1 })
            #expect(store.maintenanceFigures.checkpointsBusy == 0)
            try relaxedWrite(store)
            #expect(store.maintenanceFigures.walFrames < frames / 2, "the log did not start again after the checkpoint")
        }
    }

    @Test("past busyFrames a checkpoint runs while the writes go on, and the writer does not wait for it")
    func besideTheWriter() throws {
        var policy = WALPolicy()
        policy.passiveFrames = 40
        policy.pauseSeconds = 3600
        policy.busyFrames = 80
        policy.truncateFrames = .max
        try withStore(policy) { store in
            // Checkpoints are held until the writes below went through (the first may be due at
            // the store's first commit already: its schema's frames are in the log).
            let gate = Locked((entered: false, open: false))
            store.checkpointer.beforeCheckpoint.withLock { hook in
                hook = {
                    gate.withLockNotifyingAll { $0.entered = true }
                    gate.withLock(when: { $0.open }) { _ in }
                }
            }
            // The writes run on a thread of their own, so that a writer held by the checkpoint
            // fails the test instead of hanging it: they go on until a checkpoint began, then
            // write 20 more while it is held.
            let written = Locked<(began: Int?, result: Result<Int, any Error>?)>((nil, nil))
            Thread.detachNewThread {
                let result = Result { () throws -> Int in
                    var count = 0
                    while !gate.withLock({ $0.entered }) && count < 10_000 {
                        try relaxedWrite(store)
                        count += 1
                    }
                    let checkpoints = store.maintenanceFigures.passiveCheckpoints
                    written.withLockNotifyingAll { $0.began = checkpoints }
                    for _ in 0..<20 { try relaxedWrite(store) }
                    return 20
                }
                written.withLockNotifyingAll { $0.result = result }
            }
            #expect(gate.wait(until: { $0.entered }, timeout: 10) { $0.entered }, "no checkpoint began past busyFrames")
            let (began, result) = written.wait(until: { $0.result != nil }, timeout: 10) { ($0.began, $0.result) }
            #expect((try? result?.get()) == 20, "the writes waited for the checkpoint")
            #expect(began != nil && store.maintenanceFigures.passiveCheckpoints == began, "the held checkpoint ended")
            gate.withLockNotifyingAll { $0.open = true }
            if result == nil { _ = written.wait(until: { $0.result != nil }, timeout: 60) { $0 } }
            #expect(eventually(timeout: 10) { store.maintenanceFigures.passiveCheckpoints > (began ?? 0) })
        }
    }
}
