import BackhaulCore
import BackhaulQueue
import SQLite
import Threads

/// Copies the WAL back into the database: once the writes pause, on a thread and connection of
/// its own, so that neither the writer nor the disk works at it in the middle of a burst of the
/// engine's writes; and through the writer's own connection right after a commit that is synced
/// anyway (`CheckpointSchedule` says which and when). A checkpoint syncs the WAL, copies its newest
/// pages into the database file and syncs that: on a disk 5–10 ms, most of it the writeback of
/// every page the WAL took since the last, which a synced commit has just paid. A PASSIVE
/// checkpoint takes no lock a commit needs. The WAL's hard cap stays the writer's
/// (`Store.keepWALBounded`).
final class Checkpointer: @unchecked Sendable {
    // @unchecked: `connection` is used on the checkpointer's thread only; the rest is behind locks.
    private struct State {
        var schedule: CheckpointSchedule
        /// Changes whenever a commit makes a checkpoint due that the thread does not wait for yet.
        var wakes = 0
        var stopping = false
    }

    private let connection: Connection
    private let figures: Locked<MaintenanceFigures>
    private let state: Locked<State>
    private let thread = WorkerThread(name: "bh-checkpoint")
    /// Told of each checkpoint that failed (the daemon logs it).
    private let report: @Sendable (CheckpointFailure) -> Void
    /// Runs before each checkpoint, on the checkpointer's thread (tests hold a checkpoint with it).
    let beforeCheckpoint = Locked<(@Sendable () -> Void)?>(nil)

    init(
        path: String, policy: WALPolicy, figures: Locked<MaintenanceFigures>,
        report: @escaping @Sendable (CheckpointFailure) -> Void
    ) throws {
        connection = try Connection(path: path)
        // Until it has read the database, a connection does not know that its journal is a WAL, and
        // a checkpoint through it does nothing (SQLite answers -1 frames). At NORMAL, as at FULL,
        // a checkpoint syncs the WAL before it copies and the database after.
        try connection.execute("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL")
        self.figures = figures
        self.report = report
        state = Locked(State(schedule: CheckpointSchedule(policy: policy)))
    }

    func start() { thread.start { [self] in run() } }

    func stop() {
        state.withLockNotifyingAll { $0.stopping = true }
        thread.join()
    }

    /// After a commit of the writer's (on its thread, with its connection `db`) that left `frames`
    /// in the WAL (`synced`: the settler syncs the WAL for it): the checkpointer is woken only when
    /// that makes a checkpoint due at the pause; when the schedule says so, the writer copies the
    /// WAL back itself, here, and its next write starts the WAL over, in place.
    func committed(frames: Int, synced: Bool, by db: Connection) {
        let now = monotonicSeconds()
        let step = state.withLockNotifyingAllIfNeeded { state in
            let step = state.schedule.committed(frames: frames, synced: synced, at: now)
            if step == .wake { state.wakes += 1 }
            return (step, step == .wake)
        }
        guard step == .checkpointHere else { return }
        let outcome = Checkpointer.run(.passive, on: db, figures: figures, report: report)
        // The thread may be waiting for a commit: what this one left is for it to see.
        state.withLockNotifyingAll { state in
            state.schedule.finished(outcome, at: monotonicSeconds())
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
                beforeCheckpoint.withLock { $0 }?()
                let outcome = Checkpointer.run(.passive, on: connection, figures: figures, report: report)
                state.withLock { $0.schedule.finished(outcome, at: monotonicSeconds()) }
            }
        }
    }

    /// Runs a checkpoint of `mode` through `db` and counts it: copied (all or part), held back by
    /// another connection (busy), or failed, which is counted and reported apart, never as busy.
    static func run(
        _ mode: Connection.CheckpointMode, on db: Connection, figures: Locked<MaintenanceFigures>,
        report: @Sendable (CheckpointFailure) -> Void
    ) -> CheckpointOutcome {
        let outcome: CheckpointOutcome
        do {
            outcome = try db.checkpoint(mode).map { .ran(frames: $0.frames, copied: $0.copied) } ?? .busy
        } catch {
            outcome = .failed
            report(CheckpointFailure(mode: mode, error: error))
        }
        figures.withLock { figures in
            switch mode {
            case .truncate: figures.truncateCheckpoints += 1
            default: figures.passiveCheckpoints += 1
            }
            switch outcome {
            case .ran(let frames, let copied) where copied < frames: figures.checkpointsBusy += 1
            case .busy: figures.checkpointsBusy += 1
            case .failed: figures.checkpointErrors += 1
            case .ran: break
            }
        }
        return outcome
    }
}

/// A checkpoint that failed: its mode and SQLite's error (an I/O error, a full disk, corruption).
public struct CheckpointFailure: Sendable, CustomStringConvertible {
    public let mode: Connection.CheckpointMode
    public let error: SQLiteError

    public var description: String { "\(mode) checkpoint failed: \(error)" }

    /// The failed sync behind it, when SQLite's error is one of a sync (SQLITE_IOERR_FSYNC or
    /// SQLITE_IOERR_DIR_FSYNC), with the errno SQLite saw.
    func syncFailure(path: String) -> SyncFailure? {
        guard error.isSyncError else { return nil }
        return SyncFailure(errno: error.systemErrno, call: "checkpoint fsync", path: path)
    }
}

/// What a checkpoint did.
enum CheckpointOutcome: Equatable {
    /// It ran: the WAL's frames and how many of them are copied back (fewer while readers need
    /// the older pages).
    case ran(frames: Int, copied: Int)
    /// Another connection held the WAL (SQLITE_BUSY).
    case busy
    case failed
}

/// When the checkpointer copies the WAL back (docs/operations.md, "The state on disk"): a pure
/// schedule, given the time by its caller.
///
/// - Once the WAL holds `pauseFrames` frames not yet copied back, a checkpoint is due when no
///   commit came for `pauseSeconds`: a burst ends before its WAL is written back and copied, each
///   page once however often the burst rewrote it. A WAL of fewer frames waits for more (or for
///   the clean stop's TRUNCATE).
/// - After a commit that the settler syncs anyway (a write a client waits for), past
///   `pauseFrames` the writer copies the WAL back at once: the sync has written the WAL back
///   already, so this costs little, and the WAL, started over at the next write, stays short and
///   is rewritten in place. Without it, durable writes that never pause (single POSTs) grew the
///   WAL to the cap, and every sync that extended the file also committed the file system's
///   journal: 3,703 POSTs/s with a p99 of 66 ms, against 12,000 and 3.5 ms.
/// - Writes that never pause reach the writer's hard cap (`WALPolicy.capFrames`), where it empties
///   the WAL itself (`Store.keepWALBounded`).
/// - One that could not copy all it was given (readers held it) is not tried again before another
///   `pauseSeconds`; one that failed waits twice as long as the last failed one did, from
///   `pauseSeconds` up to `maxRetrySeconds`.
///
/// What is copied is known from the frame counts alone: a WAL grows until a writer starts it over
/// (after everything was copied), so a count below the last one is a new WAL. A new WAL whose
/// first commit is longer than the old WAL was reads as the old one grown: its checkpoint then
/// comes at most `pauseFrames` frames late.
struct CheckpointSchedule {
    enum Step: Equatable {
        /// Nothing to do for this many seconds (nil: until a commit makes a checkpoint due).
        case wait(Double?)
        case passive
    }

    /// What a commit calls for: nothing, the checkpointer woken (one is due at the pause), or the
    /// WAL copied back by the writer itself, at once.
    enum CommitStep: Equatable {
        case none, wake, checkpointHere
    }

    static let maxRetrySeconds = 30.0

    let policy: WALPolicy
    /// Frames in the WAL after the last commit, and how many of them are copied back.
    private(set) var frames = 0
    private var copied = 0
    private var lastCommit = 0.0
    private var notBefore = 0.0
    private var failureDelay = 0.0
    private var running = false
    /// Whether the thread was told of the checkpoint due now (a commit wakes it only once).
    private var signalled = false

    init(policy: WALPolicy) { self.policy = policy }

    var uncopied: Int { frames - copied }

    private var due: Bool { !running && uncopied >= policy.pauseFrames }

    /// A commit left `frames` in the WAL at `now` (`synced`: the settler syncs the WAL for it).
    mutating func committed(frames: Int, synced: Bool, at now: Double) -> CommitStep {
        if frames < self.frames { copied = 0 }
        self.frames = frames
        lastCommit = now
        if synced, due, now >= notBefore {
            running = true
            signalled = false
            return .checkpointHere
        }
        let wake = due && !signalled
        signalled = due
        return wake ? .wake : .none
    }

    /// What to do at `now`; a checkpoint returned is under way until `finished`.
    mutating func next(at now: Double) -> Step {
        signalled = due
        guard due else { return .wait(nil) }
        let at = max(notBefore, lastCommit + policy.pauseSeconds)
        guard now >= at else { return .wait(at - now) }
        running = true
        return .passive
    }

    /// The checkpoint under way ended at `now`.
    mutating func finished(_ outcome: CheckpointOutcome, at now: Double) {
        running = false
        switch outcome {
        case .ran(let frames, let copied):
            failureDelay = 0
            // Frames of a WAL that started over since are not this WAL's.
            if frames <= self.frames { self.copied = max(self.copied, copied) }
            if copied < frames { notBefore = now + policy.pauseSeconds }
        case .busy:
            notBefore = now + policy.pauseSeconds
        case .failed:
            failureDelay = min(Self.maxRetrySeconds, max(policy.pauseSeconds, failureDelay * 2))
            notBefore = now + failureDelay
        }
        signalled = due
    }
}
