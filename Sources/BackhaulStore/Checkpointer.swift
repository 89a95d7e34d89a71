import BackhaulCore
import SQLite
import Threads

/// Copies the WAL back into the database so that neither the writer nor the disk works at it in
/// the middle of a burst of the engine's writes: on a thread and connection of its own when those
/// writes pause (or beside writes that never do), and through the writer's own connection after a
/// commit that is synced anyway, where it costs little (`CheckpointSchedule` says which and when).
///
/// A checkpoint syncs the WAL, copies its newest pages into the database file and syncs that: on
/// a disk, 5–10 ms each time, most of it the writeback of every page the log took since the last.
/// Run by the writer after a commit, every write waited for it, and the engine's transfers with
/// them (a transfer that ended is not followed by the next until its commit went through); run
/// beside the writer, the writeback still took the cores the transfers needed. A PASSIVE checkpoint
/// takes no lock that a commit needs (it copies what was committed when it began, and the writer
/// appends behind it). The log's bound stays the writer's (`Store.keepWALBounded`): the checkpoints
/// here keep what it has to copy short.
final class Checkpointer: @unchecked Sendable {
    // @unchecked: `connection` is used on the checkpointer's thread only; the rest is behind locks.
    private struct State {
        var schedule: CheckpointSchedule
        /// Changes whenever a commit makes a checkpoint due sooner than the thread waits for.
        var wakes = 0
        var stopping = false
    }

    private let connection: Connection
    private let figures: Locked<MaintenanceFigures>
    private let state: Locked<State>
    private let thread = WorkerThread(name: "bh-checkpoint")
    /// Runs before each checkpoint, on the checkpointer's thread (tests hold a checkpoint with it).
    let beforeCheckpoint = Locked<(@Sendable () -> Void)?>(nil)

    init(path: String, policy: WALPolicy, figures: Locked<MaintenanceFigures>) throws {
        connection = try Connection(path: path)
        // Until it has read the database, a connection does not know that its log is a WAL, and
        // a checkpoint through it does nothing (SQLite answers -1 frames). At NORMAL, as at FULL,
        // a checkpoint syncs the WAL before it copies and the database after.
        try connection.execute("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL")
        self.figures = figures
        state = Locked(State(schedule: CheckpointSchedule(policy: policy)))
    }

    func start() { thread.start { [self] in run() } }

    func stop() {
        state.withLockNotifyingAll { $0.stopping = true }
        thread.join()
    }

    /// After a commit of the writer's (on its thread, with its connection `db`; `synced`: the
    /// settler syncs the WAL for it): noted, and the checkpointer woken only when that makes a
    /// checkpoint due. When the schedule says so (`CheckpointSchedule.CommitStep.checkpointHere`),
    /// the writer copies the log back itself, here, so that its next write finds it all copied back
    /// and starts it over.
    func committed(frames: Int, synced: Bool, by db: Connection) {
        let now = monotonicSeconds()
        let log = db.walLogsBegun
        let step = state.withLockNotifyingAllIfNeeded { state in
            let step = state.schedule.committed(frames: frames, log: log, synced: synced, at: now)
            if step == .wake { state.wakes += 1 }
            return (step, step == .wake)
        }
        guard step == .checkpointHere else { return }
        let result = checkpoint(db)
        // The checkpointer may have looked while this ran (nothing to do then) and be waiting for
        // a commit: what this one left (readers held it back, or it failed) is for it to see.
        state.withLockNotifyingAll { state in
            state.schedule.finished(result, at: monotonicSeconds())
            state.wakes += 1
        }
    }

    private func run() {
        while true {
            let (step, wakes) = state.withLock { state in
                (state.stopping ? nil : state.schedule.next(at: monotonicSeconds()), state.wakes)
            }
            switch step {
            case nil: return
            case .wait(let seconds):
                state.wait(until: { $0.wakes != wakes || $0.stopping }, timeout: seconds ?? 3600) { _ in }
            case .passive:
                let result = checkpoint(connection)
                state.withLock { $0.schedule.finished(result, at: monotonicSeconds()) }
            }
        }
    }

    /// Runs a PASSIVE checkpoint through `db` and counts it. An error (a full disk, an I/O error)
    /// counts as busy: the log stays as it was, and the schedule tries again after a pause, as after
    /// readers held one up.
    private func checkpoint(_ db: Connection) -> (frames: Int, copied: Int)? {
        if db === connection { beforeCheckpoint.withLock { $0 }?() }
        let result = try? db.checkpoint(.passive)
        figures.withLock { figures in
            figures.passiveCheckpoints += 1
            if result.map({ $0.copied < $0.frames }) ?? true { figures.checkpointsBusy += 1 }
        }
        return result
    }
}

/// When the checkpointer copies the WAL back (SPEC §4.4): a pure schedule, given the time by its
/// caller.
///
/// - Once `passiveFrames` frames are not yet copied back, a checkpoint is due. What it costs is
///   mostly the writeback of the log's pages not yet on disk. After a commit the settler syncs (an
///   API write that must be durable: that sync writes the log back anyway), the writer runs it at
///   once: it costs little there, and the log, all copied back, starts over at the next write and
///   stays short, its file rewritten in place (an `fdatasync` that extends a file also commits
///   the file system's journal). After the engine's commits, which are not synced, it runs when no
///   commit came for `pauseSeconds`: a burst of writes ends before its log is written back and
///   copied, each page once however often the burst rewrote it.
/// - Writes that do not pause get one past `busyFrames` frames in the log, beside them. The log
///   starts over only when a write finds every frame copied back, which a checkpoint beside the
///   writes never leaves (they add frames meanwhile): so once one has left at most `passiveFrames`
///   to copy, the writer copies that rest itself after its next commit (a short wait, once a
///   `busyFrames` of log). At `truncateFrames` the writer empties the log (`Store.keepWALBounded`).
/// - One that could not copy what it was given (readers held it, or it failed) is not tried again
///   before another `pauseSeconds`.
struct CheckpointSchedule {
    enum Step: Equatable {
        /// Nothing to do for this many seconds (nil: until a commit makes a checkpoint due).
        case wait(Double?)
        case passive
    }

    /// What a commit calls for: nothing, the checkpointer woken (a checkpoint is due sooner than it
    /// waits for), or the log copied back by the writer itself, at once.
    enum CommitStep: Equatable {
        case none, wake, checkpointHere
    }

    let policy: WALPolicy
    /// The log as the last commit left it: its frames, and which beginning of it (the writer's
    /// `walLogsBegun`: a new log has nothing copied back yet).
    private var frames = 0
    private var log = 0
    /// Frames of this log copied back, and how many it had when the last checkpoint began.
    private var copied = 0
    private var framesAtLastStart = 0
    private var quietSince = 0.0
    private var notBefore = 0.0
    /// The log a checkpoint under way works on (nil: none runs).
    private var running: Int?
    /// The most urgent step a commit already woke the checkpointer for.
    private var signalled = Urgency.none
    /// A checkpoint beside the writes ran since the writer last copied the rest: the writer copies
    /// the rest once after each (if readers keep the log from starting over, not after every commit).
    private var besideRan = false

    init(policy: WALPolicy) { self.policy = policy }

    private enum Urgency: Comparable {
        case none, atPause, now
    }

    var uncopied: Int { frames - copied }

    /// A commit left `frames` in the log begun `log` times; `synced`: the settler syncs the log for it.
    mutating func committed(frames: Int, log: Int, synced: Bool, at now: Double) -> CommitStep {
        // A new log, or one emptied (the writer's TRUNCATE; its next commit begins it again).
        if log != self.log || frames < copied {
            self.log = log
            copied = 0
            framesAtLastStart = 0
            besideRan = false
        }
        self.frames = frames
        quietSince = now
        let synced = synced && uncopied >= policy.passiveFrames
        let rest = besideRan && copied > 0 && uncopied <= policy.passiveFrames
        if running == nil, synced || rest, uncopied > 0, now >= notBefore {
            begin()
            signalled = .none
            besideRan = false
            return .checkpointHere
        }
        let urgency = self.urgency
        defer { signalled = urgency }
        return urgency > signalled ? .wake : .none
    }

    private var urgency: Urgency {
        guard running == nil else { return .none }
        if frames >= policy.busyFrames, frames - framesAtLastStart >= policy.passiveFrames { return .now }
        return uncopied >= policy.passiveFrames ? .atPause : .none
    }

    /// What to do at `now`; a checkpoint returned is under way until `finished`.
    mutating func next(at now: Double) -> Step {
        guard running == nil else { return .wait(nil) }
        let urgency = self.urgency
        signalled = urgency
        if urgency == .none { return .wait(nil) }
        let due = max(notBefore, urgency == .now ? now : quietSince + policy.pauseSeconds)
        guard now >= due else { return .wait(due - now) }
        begin()
        if frames >= policy.busyFrames { besideRan = true }
        return .passive
    }

    /// A checkpoint starts on the log as it is now.
    private mutating func begin() {
        running = log
        framesAtLastStart = frames
    }

    /// A checkpoint ended: `result` is SQLite's (the log's frames and how many are copied back),
    /// nil when it could not run.
    mutating func finished(_ result: (frames: Int, copied: Int)?, at now: Double) {
        let sameLog = running == log
        running = nil
        defer {
            // The checkpointer looks at what is due next itself: a commit wakes it only for more.
            signalled = urgency
        }
        guard let result, result.frames >= 0 else {
            notBefore = now + policy.pauseSeconds
            return
        }
        // The figures of a log that has started over since are not this one's.
        guard sameLog else { return }
        copied = max(copied, result.copied)
        if result.copied < result.frames { notBefore = now + policy.pauseSeconds }
    }
}
