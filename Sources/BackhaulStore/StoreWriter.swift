import BackhaulCore
import Glibc
import SQLite
import Threads

/// The one connection that writes, on a thread of its own (the store's serial executor). Callers
/// hand it jobs; it runs every job waiting at that moment in one transaction, each in a savepoint
/// of its own (a job that throws undoes only itself), and commits once: concurrent API writes
/// share one fsync (group commit), and the engine's bookkeeping rides along.
///
/// A batch with a job that must be durable commits with `synchronous=FULL` (fsync before the
/// answer), else `NORMAL` (safe against a crash of the process; a power cut may lose the last
/// moments of engine bookkeeping, which only repeats work). After the commit, the change log goes
/// to the observers, then each job learns its result.
final class StoreWriter: @unchecked Sendable {
    // @unchecked: `connection` and `log` are used on the writer thread only; the queue and the
    // observers are behind their locks.
    struct Job {
        let durable: Bool
        /// Runs on the writer thread inside the batch's transaction.
        let body: (Connection, ChangeLog) throws -> Void
        /// Called on the writer thread once the batch committed (or failed).
        let done: (StoreError?) -> Void
    }

    private let connection: Connection
    private let log: ChangeLog
    private let queue = Locked<(jobs: [Job], stopping: Bool)>(([], false))
    private let observers = Locked<[@Sendable (StoreChanges) -> Void]>([])
    private let thread = WorkerThread()
    private var synchronousFull = true
    /// Runs after every commit that changed something, before observers: keeps the WAL bounded.
    var afterCommit: ((Connection) -> Void)?

    init(connection: Connection, log: ChangeLog) {
        self.connection = connection
        self.log = log
    }

    func start() {
        thread.start { [self] in run() }
    }

    /// Finishes the jobs already handed over, then stops.
    func stop() {
        queue.withLockNotifyingAll { $0.stopping = true }
        thread.join()
    }

    func observe(_ observer: @escaping @Sendable (StoreChanges) -> Void) {
        observers.withLock { $0.append(observer) }
    }

    /// Hands a job over; its `done` runs after its batch commits.
    func submit(_ job: Job) {
        let accepted = queue.withLockNotifyingAll { state -> Bool in
            guard !state.stopping else { return false }
            state.jobs.append(job)
            return true
        }
        if !accepted { job.done(.database("the store is closed")) }
    }

    /// Runs `body` in the next batch and waits for its commit: the caller's answer is durable (or
    /// relaxed) once this returns.
    func perform<T>(durable: Bool, _ body: @escaping (Connection, ChangeLog) throws -> T) throws(StoreError) -> T {
        let outcome = Outcome<T>()
        submit(
            Job(
                durable: durable, body: { db, log in outcome.value = try body(db, log) }, done: { error in outcome.finish(error) }
            ))
        return try outcome.wait()
    }

    private func run() {
        while true {
            let (batch, stopping) = queue.wait(until: { !$0.jobs.isEmpty || $0.stopping }, timeout: 3600) { state in
                defer { state.jobs.removeAll(keepingCapacity: true) }
                return (state.jobs, state.stopping)
            }
            if !batch.isEmpty { commit(batch) }
            if stopping, queue.withLock({ $0.jobs.isEmpty }) { return }
        }
    }

    /// Runs a batch in one transaction. First without savepoints (most batches have no job that
    /// throws, and a savepoint copies every page it touches); if a job throws, the whole batch is
    /// rolled back and run again with a savepoint per job, so only that job is undone. Job bodies
    /// may therefore run twice: they write only through the connection and the change log, both
    /// rolled back in between.
    private func commit(_ batch: [Job]) {
        var results = [StoreError?](repeating: nil, count: batch.count)
        do {
            let durable = batch.contains { $0.durable }
            if durable != synchronousFull {
                try connection.execute(durable ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL")
                synchronousFull = durable
            }
            try connection.run("BEGIN IMMEDIATE")
            var failed = false
            for job in batch {
                do { try job.body(connection, log) } catch {
                    failed = true
                    break
                }
            }
            if failed {
                try connection.run("ROLLBACK")
                log.discard()
                try connection.run("BEGIN IMMEDIATE")
                for (index, job) in batch.enumerated() {
                    let mark = log.mark
                    do {
                        try connection.run("SAVEPOINT job")
                        try job.body(connection, log)
                        try connection.run("RELEASE job")
                    } catch {
                        _ = try? connection.run("ROLLBACK TO job")
                        _ = try? connection.run("RELEASE job")
                        log.rollBack(to: mark)
                        results[index] = StoreError(error)
                    }
                }
            }
            try flushCounts()
            try connection.run("COMMIT")
        } catch {
            _ = try? connection.run("ROLLBACK")
            log.discard()
            let failure = StoreError(error)
            for index in results.indices where results[index] == nil { results[index] = failure }
            for (job, result) in zip(batch, results) { job.done(result) }
            return
        }
        let (changes, endedDownloads, completedFiles) = log.take()
        // What the commit made final is acted on only now that it is on disk.
        for path in endedDownloads { unlink(DownloadSpec.partPath(of: path)) }
        for path in completedFiles { unlink(path) }
        afterCommit?(connection)
        if !changes.isEmpty {
            for observer in observers.withLock({ $0 }) { observer(changes) }
        }
        for (job, result) in zip(batch, results) { job.done(result) }
    }
}

extension StoreWriter {
    /// Writes the transaction's changes of the per-session task counts: one upsert per session
    /// and state it touched, instead of two statements per task change.
    private func flushCounts() throws {
        for (session, states) in log.takeCounts() {
            for (state, delta) in states where delta != 0 {
                try connection.run(
                    """
                    INSERT INTO session_counts (session_id, state, count) VALUES (?, ?, ?)
                    ON CONFLICT (session_id, state) DO UPDATE SET count = count + excluded.count
                    """, [session, state, delta])
            }
        }
    }
}

/// A job's answer, waited for by the thread that handed it over.
private final class Outcome<T>: @unchecked Sendable {
    // @unchecked: `value` is written on the writer thread before `finish`, read after `wait`.
    var value: T?
    private let state = Locked<(done: Bool, error: StoreError?)>((false, nil))

    func finish(_ error: StoreError?) {
        state.withLockNotifyingAll { $0 = (true, error) }
    }

    func wait() throws(StoreError) -> T {
        let error = state.wait(until: { $0.done }, timeout: 1e9) { $0.error }
        if let error { throw error }
        guard let value else { throw StoreError.database("a write ended without a result") }
        return value
    }
}

extension StoreError {
    /// Maps what a write threw to the store's terms.
    init(_ error: any Error) {
        switch error {
        case let error as StoreError: self = error
        case let error as ValidationError: self = .invalid(error)
        case let error as SQLiteError where error.isStorageFull: self = .storageFull
        default: self = .database(String(describing: error))
        }
    }
}
