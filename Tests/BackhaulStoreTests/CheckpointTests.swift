import BackhaulCore
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
        /// A commit left `frames` in the log begun `log` times; whether that wakes the checkpointer.
        case commit(frames: Int, log: Int, at: Double, wakes: Bool)
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
            case .commit(let frames, let log, let time, let wakes):
                let woke = schedule.committed(frames: frames, log: log, at: time)
                #expect(woke == wakes, "event \(index): a commit of \(frames) frames", sourceLocation: sourceLocation)
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

    @Test("past busyFrames one runs at once, and one each passiveFrames more while the writes go on")
    func whileBusy() {
        play([
            .commit(frames: 500, log: 1, at: 0, wakes: true),
            .commit(frames: 1000, log: 1, at: 0.01, wakes: true),  // sooner than the pause
            .next(at: 0.01, .passive),
            .commit(frames: 1050, log: 1, at: 0.02, wakes: false),  // none while one runs
            .finished((frames: 1000, copied: 1000), at: 0.03),
            .uncopied(50), .next(at: 0.03, .wait(nil)),
            .commit(frames: 1099, log: 1, at: 0.04, wakes: false),
            .commit(frames: 1100, log: 1, at: 0.05, wakes: true),  // 100 more since it began
            .next(at: 0.05, .passive),
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

/// The checkpointer copies the WAL back when the writes pause, or past `busyFrames` beside them,
/// and the writer never waits for it.
@Suite("WAL checkpoints")
struct CheckpointTests {
    private func withStore(_ policy: WALPolicy, _ body: (Store) throws -> Void) throws {
        let path = "/tmp/backhaul-ckpt-\(getpid())-\(RandomID.make(prefix: "", at: 0)).db"
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        let store = try Store(path: path, walPolicy: policy)
        defer { store.close() }
        try body(store)
    }

    /// Writes batches of tasks until the log holds at least `frames` frames.
    private func write(_ store: Store, untilFrames frames: Int, name: String) throws {
        var batch = 0
        while store.maintenanceFigures.walFrames < frames {
            _ = try store.createTasks(sessionID: "s", (0..<10).map { makeTask("\(name)\(batch)-\($0)") })
            batch += 1
            #expect(batch < 1000, "the log never reached \(frames) frames")
            if batch >= 1000 { return }
        }
    }

    /// Waits (at most 10 s) until `condition` holds of the store's figures.
    private func eventually(_ store: Store, _ condition: (MaintenanceFigures) -> Bool) -> MaintenanceFigures {
        let deadline = monotonicSeconds() + 10
        while !condition(store.maintenanceFigures) && monotonicSeconds() < deadline { usleep(5_000) }
        return store.maintenanceFigures
    }

    @Test("a burst's log is copied back once the writes pause, and the next write starts it again")
    func atPause() throws {
        var policy = WALPolicy()
        policy.passiveFrames = 40
        policy.pauseSeconds = 1
        policy.busyFrames = .max
        policy.truncateFrames = .max
        try withStore(policy) { store in
            _ = try store.putSession(id: "s", configuration: TransferConfiguration())
            try write(store, untilFrames: 80, name: "a")
            let frames = store.maintenanceFigures.walFrames
            #expect(store.maintenanceFigures.passiveCheckpoints == 0, "a checkpoint ran before the writes paused")
            let figures = eventually(store) { $0.passiveCheckpoints >= 1 }
            #expect(figures.passiveCheckpoints >= 1)
            #expect(figures.checkpointsBusy == 0)
            _ = try store.createTasks(sessionID: "s", [makeTask("after")])
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
            let written = Locked<(began: Int?, result: Result<Int, StoreError>?)>((nil, nil))
            Thread.detachNewThread {
                let result = Result { () throws(StoreError) -> Int in
                    _ = try store.putSession(id: "s", configuration: TransferConfiguration())
                    var batch = 0
                    while !gate.withLock({ $0.entered }) && batch < 1000 {
                        _ = try store.createTasks(sessionID: "s", (0..<10).map { makeTask("c\(batch)-\($0)") })
                        batch += 1
                    }
                    let checkpoints = store.maintenanceFigures.passiveCheckpoints
                    written.withLockNotifyingAll { $0.began = checkpoints }
                    for index in 0..<20 { _ = try store.createTasks(sessionID: "s", [makeTask("held\(index)")]) }
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
            let figures = eventually(store) { $0.passiveCheckpoints > (began ?? 0) }
            #expect(figures.passiveCheckpoints > (began ?? 0))
        }
    }
}
