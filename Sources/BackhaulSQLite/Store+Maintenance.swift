import BackhaulCore
import BackhaulQueue
import Glibc
import JSONCodec
import SQLite
import Threads

/// How the store keeps the WAL bounded (docs/operations.md, "The state on disk"). SQLite's
/// automatic checkpoint runs inside the commit that crosses its threshold, so a write waits for it;
/// and it is a PASSIVE one, which copies back only what no reader still needs, so under steady
/// reads the WAL can grow without end. Here the checkpointer copies the log back on a thread of
/// its own once the writes pause (`CheckpointSchedule`), and at the hard cap the writer empties it
/// with a TRUNCATE checkpoint, which waits (up to the busy timeout) for the readers of the moment
/// to finish their short reads. When the log starts over, its file is cut back to
/// `journalSizeLimit` (4 MiB): above what the durable writes' log reaches between the writer's
/// checkpoints (about 1,000 frames), so that log is rewritten in place (an `fdatasync` that extends
/// a file also commits the file system's journal); and a long burst's log does not keep its size on
/// disk afterwards (at the cap's 64 MiB, 3,000 tasks churned left the state directory at 20 MB, not
/// under 16 MiB).
public struct WALPolicy: Sendable {
    /// Frames not yet copied back past which a checkpoint runs once the writes pause.
    public var pauseFrames = 1000
    /// A pause: no commit for this long.
    public var pauseSeconds = 0.25
    /// The hard cap: frames in the log past which the writer empties it (TRUNCATE).
    public var capFrames = 16384

    /// `journal_size_limit`: what the log's file is cut back to when it starts over.
    public var journalSizeLimit = 4 << 20

    public init() {}
}

extension Store {
    public var maintenanceFigures: MaintenanceFigures { maintenance.withLock { $0 } }
    /// One daemon holds no leases.
    public var leaseFence: LeaseFence? { nil }

    /// After a commit (on the writer's thread; `synced`: the settler syncs it): counted; past the
    /// cap the log emptied here (TRUNCATE: it holds the writer, and waits for the readers of the
    /// moment); and told to the checkpointer, which copies the log back once the writes pause, or
    /// has the writer do it now after a synced commit (`Checkpointer`).
    static func keepWALBounded(
        _ db: Connection, _ policy: WALPolicy, _ figures: Locked<MaintenanceFigures>, _ checkpointer: Checkpointer,
        frames: Int, synced: Bool, report: @Sendable (CheckpointFailure) -> Void
    ) {
        var frames = frames
        if frames >= policy.capFrames,
            case .ran(let logged, let copied) = Checkpointer.run(.truncate, on: db, figures: figures, report: report),
            copied >= logged
        {
            frames = 0
        }
        figures.withLock { figures in
            figures.commits += 1
            figures.walFrames = frames
        }
        checkpointer.committed(frames: frames, synced: synced, by: db)
    }

    /// Removes finished tasks kept longer than their retention (the session's
    /// `finished_task_retention`, else `defaultRetention`), counted from `finished_at`, whose
    /// events have no delivery still pending; with them go their events, deliveries and attempt
    /// history. At most `batch` tasks per call (one short transaction); returns how many went.
    public func pruneFinishedTasks(defaultRetention: Double, batch: Int = 500) throws(StoreError) -> Int {
        let now = self.now
        return try write(.relaxed) { [self] db in
            let cutoff = now - (try Self.shortestRetention(db, defaultRetention: defaultRetention))
            let due = try db.query(
                """
                SELECT t.seq, t.id FROM tasks t INDEXED BY tasks_finished LEFT JOIN sessions s ON s.id = t.session_id
                WHERE (t.state = 'completed' OR t.state = 'failed' OR t.state = 'cancelled') AND t.finished_at < ?
                    AND t.finished_at < ? - COALESCE(json_extract(s.configuration, '$.finished_task_retention'), ?)
                    AND NOT EXISTS (SELECT 1 FROM events e WHERE e.task_id = t.id
                                    AND EXISTS (SELECT 1 FROM deliveries d WHERE d.event_seq = e.seq AND d.state = 'pending'))
                ORDER BY t.finished_at LIMIT ?
                """, [cutoff, now, defaultRetention, batch]
            ) { ($0.int(0), $0.string(1)) }
            guard !due.isEmpty else { return 0 }
            try deleteFinished(db, sequences: due.map(\.0), ids: due.map(\.1))
            maintenance.withLock { $0.tasksPruned += due.count }
            return due.count
        }
    }

    /// The shortest retention in force: the daemon's, or a session's own if shorter.
    public func shortestRetention(defaultRetention: Double) throws(StoreError) -> Double {
        try read { db in try Self.shortestRetention(db, defaultRetention: defaultRetention) }
    }

    static func shortestRetention(_ db: Connection, defaultRetention: Double) throws -> Double {
        let shortest =
            try db.queryFirst(
                "SELECT MIN(json_extract(configuration, '$.finished_task_retention')) FROM sessions"
            ) { $0.optionalDouble(0) } ?? nil
        return min(defaultRetention, shortest ?? defaultRetention)
    }

    /// Deletes finished tasks with their events, those events' deliveries and (by trigger) their
    /// attempt history.
    func deleteFinished(_ db: Connection, sequences: [Int64], ids: [String]) throws {
        let idList = JSON.array(ids.map { .string($0) }).serialized()
        try db.run(
            """
            DELETE FROM deliveries WHERE event_seq IN
                (SELECT seq FROM events WHERE task_id IN (SELECT value FROM json_each(?)))
            """, [idList])
        let events = try db.run("DELETE FROM events WHERE task_id IN (SELECT value FROM json_each(?))", [idList])
        try TaskRows.delete(db, sequences: sequences, feed: feed)
        maintenance.withLock { $0.eventsPruned += events }
        recorder.update { $0.pruned += sequences.count }
    }

    /// Drops what is older than `retention` and no longer needed: events of tasks still kept, and
    /// session events, that no pending delivery refers to; finished deliveries; subscriptions of
    /// removed sessions with nothing pending. At most `batch` rows of each per call.
    public func pruneEventLog(olderThan retention: Double, batch: Int = 2000) throws(StoreError) -> Int {
        let now = self.now
        let cutoff = now - retention
        return try write(.relaxed) { [self] db in
            try db.run(
                "DELETE FROM deliveries WHERE seq IN (SELECT seq FROM deliveries WHERE state != 'pending' AND created_at < ? LIMIT ?)",
                [cutoff, batch])
            // Events are appended in time order, so the old ones come first by seq: the sweep reads
            // the first `batch` events that no pending delivery pins and takes the old ones up to
            // the first event young enough to keep (each round reads what it deletes, not the whole
            // table). An event dated after now (written while the clock was ahead) neither goes nor
            // stops the sweep; one dated before its neighbours (the clock stepped back) waits
            // until those before it go.
            let window = try db.query(
                """
                SELECT seq, created_at FROM events e
                WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_seq = e.seq AND d.state = 'pending')
                ORDER BY seq LIMIT ?
                """, [batch]
            ) { ($0.int(0), $0.double(1)) }
            var old: [JSON] = []
            for (seq, createdAt) in window {
                if createdAt < cutoff {
                    old.append(.int(seq))
                } else if createdAt <= now {
                    break
                }
            }
            let events =
                old.isEmpty
                ? 0
                : try db.run("DELETE FROM events WHERE seq IN (SELECT value FROM json_each(?))", [JSON.array(old).serialized()])
            try db.run(
                """
                DELETE FROM webhooks WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = webhooks.session_id)
                    AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.webhook_id = webhooks.id AND d.state = 'pending')
                """)
            maintenance.withLock { $0.eventsPruned += events }
            return events
        }
    }

    /// Returns up to `pages` free pages to the file system (`PRAGMA incremental_vacuum`), so the
    /// file shrinks after pruning. Returns how many were free before.
    public func vacuumFreePages(_ pages: Int = 2000) throws(StoreError) -> Int {
        try write(.relaxed) { [self] db in
            let free = Int(try db.queryFirst("PRAGMA freelist_count") { $0.int(0) } ?? 0)
            guard free > 0 else { return 0 }
            try db.execute("PRAGMA incremental_vacuum(\(pages))")
            maintenance.withLock { $0.pagesVacuumed += min(free, pages) }
            return free
        }
    }

    /// How long ago the oldest finished task still kept finished (nil: none), for `/metrics`.
    public func oldestFinishedTask(now: Timestamp) throws(StoreError) -> Double? {
        try read { db in
            try db.queryFirst(
                "SELECT MIN(finished_at) FROM tasks INDEXED BY tasks_finished WHERE finished_at IS NOT NULL AND \(StoreRules.finalCondition)"
            ) { $0.optionalDouble(0) }?.map { now - $0 }
        }
    }
}

/// Runs the store's housekeeping on a thread of its own: retention of finished tasks, the event
/// log, free pages. Each step is a short transaction of its own, so the writer is never held
/// for long; a step with more to do comes back soon, else it sleeps `interval`, or a quarter of
/// the shortest retention in force when that is shorter (never under half a second), so a task
/// goes within a quarter of its retention after it is due.
public final class Housekeeper: Sendable {
    private let store: any StateStore
    private let retention: Double
    private let eventRetention: Double
    private let interval: Double
    /// Stopping, or woken early because a session changed (its retention may be shorter).
    private let signal = Locked((stopping: false, woken: false))
    private let thread = WorkerThread(name: "bh-housekeeper")
    /// Called with what went wrong (the daemon logs it).
    private let report: @Sendable (String) -> Void

    public init(
        store: any StateStore, finishedTaskRetention: Double, eventRetention: Double = 7 * 86_400, interval: Double = 30,
        report: @escaping @Sendable (String) -> Void
    ) {
        self.store = store
        retention = finishedTaskRetention
        self.eventRetention = eventRetention
        self.interval = interval
        self.report = report
    }

    public func start() {
        store.observe { [signal] changes in
            guard !changes.sessions.isEmpty else { return }
            signal.withLockNotifyingAll { $0.woken = true }
        }
        thread.start { [self] in run() }
    }

    public func stop() {
        signal.withLockNotifyingAll { $0.stopping = true }
        thread.join()
    }

    /// One round: returns whether more is waiting.
    @discardableResult
    public func sweep() -> Bool {
        do {
            let tasks = try store.pruneFinishedTasks(defaultRetention: retention)
            let events = try store.pruneEventLog(olderThan: eventRetention)
            let free = try store.vacuumFreePages()
            return tasks >= 500 || events >= 2000 || free > 2000
        } catch {
            report("\(error)")
            return false
        }
    }

    private func run() {
        var pause = restingPause()
        while true {
            let stopping = signal.wait(until: { $0.stopping || $0.woken }, timeout: pause) { state in
                state.woken = false
                return state.stopping
            }
            if stopping { return }
            pause = sweep() ? 0.05 : restingPause()
        }
    }

    private func restingPause() -> Double {
        let shortest = (try? store.shortestRetention(defaultRetention: retention)) ?? retention
        return max(0.5, min(interval, shortest / 4))
    }
}
