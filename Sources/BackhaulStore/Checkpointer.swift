import BackhaulCore
import SQLite
import Threads

/// Copies the WAL back into the database (PASSIVE checkpoints) on a thread and connection of its
/// own, when the writes pause, so that neither the writer nor the disk works at it in the middle of
/// a burst of writes.
///
/// A checkpoint syncs the WAL, copies its newest pages into the database file and syncs that: on
/// a disk, 5–10 ms each time, most of it the writeback of every page the log took since the last.
/// Run by the writer after a commit, every write waited for it, and the engine's transfers with
/// them (a transfer that ended is not followed by the next until its commit went through); run
/// beside the writer, the writeback still took the cores the transfers needed. So a checkpoint is
/// due when `WALPolicy.passiveFrames` frames are not yet copied back, and runs once no commit came
/// for `WALPolicy.pauseSeconds`: a burst of writes ends before its log is copied back, each page
/// once however often the burst rewrote it. Writes that do not pause get one past
/// `WALPolicy.busyFrames`, beside the writer (a PASSIVE checkpoint takes no lock a writer needs: it
/// copies what was committed when it began, and the writer appends behind it).
///
/// The WAL starts again from its beginning only when a write begins and finds every frame copied
/// back. Under writes that never pause it grows, and the writer's own TRUNCATE checkpoint
/// (`WALPolicy.truncateFrames`, `Store.keepWALBounded`) stays its bound.
final class Checkpointer: @unchecked Sendable {
    // @unchecked: `connection` is used on the checkpointer's thread only; the rest is behind `state`.
    private struct State {
        /// Frames in the log after the last commit, and how far the last checkpoint copied it back.
        var frames = 0
        var copied = 0
        /// When the last commit came (or the last checkpoint ended), `CLOCK_MONOTONIC` seconds.
        var quietSince = 0.0
        /// A checkpoint is due once the writes pause; one is due now (the writes do not pause).
        var due = false
        var urgent = false
        var running = false
        var stopping = false
    }

    private let connection: Connection
    private let policy: WALPolicy
    private let figures: Locked<MaintenanceFigures>
    private let state = Locked(State())
    private let thread = WorkerThread(name: "bh-checkpoint")
    /// Runs before each checkpoint, on the checkpointer's thread (tests hold a checkpoint with it).
    let beforeCheckpoint = Locked<(@Sendable () -> Void)?>(nil)

    init(path: String, policy: WALPolicy, figures: Locked<MaintenanceFigures>) throws {
        connection = try Connection(path: path)
        // Until it has read the database, a connection does not know that its log is a WAL, and
        // a checkpoint through it does nothing (SQLite answers -1 frames).
        try connection.execute("PRAGMA journal_mode = WAL")
        self.policy = policy
        self.figures = figures
    }

    func start() { thread.start { [self] in run() } }

    func stop() {
        state.withLockNotifyingAll { $0.stopping = true }
        thread.join()
    }

    /// After a commit that left `frames` in the log (on the writer's thread): notes it, and wakes
    /// the checkpointer only when that makes a checkpoint due. Never waits for one.
    func committed(frames: Int) {
        let now = monotonicSeconds()
        state.withLockNotifyingAllIfNeeded { state in
            // Fewer frames than were copied: the log started again from its beginning.
            if frames < state.copied { state.copied = 0 }
            state.frames = frames
            state.quietSince = now
            guard !state.running else { return ((), false) }
            let left = frames - state.copied
            if left >= policy.busyFrames, !state.urgent {
                state.urgent = true
                return ((), true)
            }
            if left >= policy.passiveFrames, !state.due {
                state.due = true
                return ((), true)
            }
            return ((), false)
        }
    }

    private func run() {
        while let due = nextCheckpoint() {
            if due { checkpoint() }
        }
    }

    /// Waits until a checkpoint is due now, or was due and no commit came for `pauseSeconds`:
    /// true then, false when the wait ended for nothing, nil once stopping.
    private func nextCheckpoint() -> Bool? {
        let (due, wait) = state.withLock { state in
            (state.due, state.due ? max(0, state.quietSince + policy.pauseSeconds - monotonicSeconds()) : 3600)
        }
        // A checkpoint that became due meanwhile ends the wait too: the pause is timed from then.
        return state.wait(until: { $0.urgent || $0.stopping || $0.due != due }, timeout: wait) { state -> Bool? in
            guard !state.stopping else { return nil }
            let paused = state.due && monotonicSeconds() - state.quietSince >= policy.pauseSeconds
            guard state.urgent || paused else { return false }
            state.urgent = false
            state.due = false
            state.running = true
            return true
        }
    }

    private func checkpoint() {
        beforeCheckpoint.withLock { $0 }?()
        let result = try? connection.checkpoint(.passive)
        let now = monotonicSeconds()
        state.withLock { state in
            state.running = false
            if let result { state.copied = result.copied }
            // What the writes added meanwhile, or what a busy checkpoint left, waits for the next
            // pause (counted from now: a checkpoint that could not run is not tried again at once).
            state.quietSince = max(state.quietSince, now)
            state.due = state.frames - state.copied >= policy.passiveFrames
        }
        figures.withLock { figures in
            figures.passiveCheckpoints += 1
            if result == nil { figures.checkpointsBusy += 1 }
        }
    }
}
