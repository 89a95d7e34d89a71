import BackhaulCore
import BackhaulQueue
import Glibc
import SQLite
import Threads

/// The one connection that writes, on a thread of its own (the store's serial executor). Callers
/// hand it jobs; it runs every job waiting at that moment in one transaction, each in a savepoint
/// of its own (a job that throws undoes only itself), and commits once: concurrent API writes
/// share one fsync (group commit), and the engine's bookkeeping rides along.
///
/// Commits do not wait for the disk (`synchronous=NORMAL`: safe against a crash of the process).
/// What a commit leaves to do goes, in commit order, to a second thread, the settler: when a
/// batch had a job that must be durable, it first makes the WAL durable with one `fdatasync` for
/// every batch committed by then (the WAL is written in commit order, so that covers them all);
/// then it removes the files the commit made final, hands the change recorder to the observers, and
/// gives each job its result. The writer meanwhile runs the next batch instead of waiting for the
/// disk. No durable write is answered, and no file is removed, before the commit is on disk; a
/// relaxed commit's answers and changes go without waiting for the disk (it is safe against a crash
/// of the process, not of the machine). A batch with nothing to sync, committed while the settler
/// has nothing in hand, is settled by the writer itself: the order is the same, and the engine's
/// commits (most of them) cost no hand-over between threads. Observers and `done` therefore run on
/// either thread, and must not wait for the store's writer.
///
/// A failed sync fails closed (docs/operations.md, "When the disk fails"): the writes it covered,
/// and every write after it, are answered with the error, no observer hears of them and no file is
/// removed for them. The sync is not tried again: after a failed `fsync` Linux may report the next
/// one as clean for pages it never wrote, so the store stays failed until the process starts over
/// and reads the state from the disk.
final class StoreWriter: @unchecked Sendable {
    // @unchecked: `connection` and `recorder` are used on the writer thread only, `walFile` on the
    // settler's; the queues and the observers are behind their locks.
    struct Job {
        let durable: Bool
        /// Runs on the writer thread inside the batch's transaction.
        let body: (Connection, ChangeRecorder) throws -> Void
        /// Called on the writer thread once the batch committed (or failed).
        let done: (StoreError?) -> Void
    }

    let connection: Connection
    let recorder: ChangeRecorder
    private let queue = Locked<(jobs: [Job], stopping: Bool)>(([], false))
    private let observers = Locked<[@Sendable (StoreChanges) -> Void]>([])
    private let thread = WorkerThread(name: "bh-writer")
    let fileRemover = FileRemoverSlot()
    /// Runs after every commit, on the writer's thread, with whether the settler will sync it:
    /// keeps the WAL bounded.
    var afterCommit: ((Connection, _ synced: Bool) -> Void)?
    /// Told of what a job or a commit threw (on the writer's thread), before it is mapped to
    /// `StoreError`: the store watches it for damage.
    var onError: ((any Error) -> Void)?

    /// A committed (or failed) batch's remaining work, in commit order.
    private struct Settlement {
        let durable: Bool
        let changes: StoreChanges
        let files: FileRemovals
        let jobs: [Job]
        let results: [StoreError?]

        /// A durable job's answer, or a file to remove, waits for the WAL's sync (`FileRemovals`).
        var needsSync: Bool { files.needsDurableCommit(durable: durable) }

        /// A batch of which nothing was written: each job not told of its own error gets `error`.
        init(failed jobs: [Job], results: [StoreError?], error: StoreError) {
            self.init(
                durable: false, changes: StoreChanges(), files: FileRemovals(), jobs: jobs,
                results: results.map { $0 ?? error })
        }

        init(
            durable: Bool, changes: StoreChanges, files: FileRemovals, jobs: [Job], results: [StoreError?]
        ) {
            self.durable = durable
            self.changes = changes
            self.files = files
            self.jobs = jobs
            self.results = results
        }
    }

    /// Settlements waiting for the settler; `busy` while it acts on some (the writer then
    /// hands its own over rather than overtake them).
    private let settlements = Locked<(pending: [Settlement], busy: Bool, stopping: Bool)>(([], false, false))
    private let settler = WorkerThread(name: "bh-settler")
    /// The WAL file, as this process syncs it (the settler's thread only).
    private let walPath: String
    private var walFile: Int32 = -1
    /// How many times the settler synced the WAL (tests hold durable writes to it).
    let walSyncs = Locked(0)
    /// Set once, by the first sync that failed: every write from then on is answered with it.
    private let failure = Locked<StoreError?>(nil)
    /// Told once, when the store fails closed (on the thread that found the failure).
    private let failed: @Sendable (StoreError) -> Void

    init(connection: Connection, recorder: ChangeRecorder, walPath: String, failed: @escaping @Sendable (StoreError) -> Void) {
        self.connection = connection
        self.recorder = recorder
        self.walPath = walPath
        self.failed = failed
    }

    /// The error every write is answered with since a sync failed, or nil.
    var failedWith: StoreError? { failure.withLock { $0 } }

    /// Fails the store closed: from now on every write is answered with `error`. The first
    /// failure is the one kept and told.
    func fail(_ error: StoreError) {
        let first = failure.withLock { failure in
            defer { if failure == nil { failure = error } }
            return failure == nil
        }
        if first { failed(error) }
    }

    func start() {
        settler.start { [self] in settle() }
        thread.start { [self] in run() }
    }

    /// Finishes the jobs already handed over, and any still held, then stops.
    func stop() {
        // Handed over under the hold's lock: a job the holding thread submits meanwhile waits
        // for the lock and then goes after these (it would otherwise overtake them). The queue
        // accepts them (not stopping yet), so no `done` runs under the lock.
        held.withLock { hold in
            if !hold.jobs.isEmpty { submit(hold.jobs) }
            hold = Hold()
        }
        queue.withLockNotifyingAll { $0.stopping = true }
        thread.join()
        settlements.withLockNotifyingAll { $0.stopping = true }
        settler.join()
        if walFile >= 0 { close(walFile) }
    }

    /// Copies the whole WAL back into the database and empties it (`wal_checkpoint(TRUNCATE)`),
    /// after `stop`, so that the database file alone is the state. Not after a failed sync: the
    /// checkpoint would sync again what the disk may not hold.
    /// Whether the WAL is empty now.
    func emptyLog() throws -> Bool {
        guard failedWith == nil, let result = try connection.checkpoint(.truncate) else { return false }
        return result.copied >= result.frames
    }

    func observe(_ observer: @escaping @Sendable (StoreChanges) -> Void) {
        observers.withLock { $0.append(observer) }
    }

    /// Hands a job over; its `done` runs after its batch commits. A job of the thread that holds
    /// its writes back (`hold`) waits for its `release`, unless the thread is to wait for the job
    /// (`waited`): then the jobs held go over with it, in order, or the thread would wait for itself.
    func submit(_ job: Job, waited: Bool = false) {
        let handed = held.withLock { held -> [Job] in
            guard held.isCaller else { return [job] }
            held.jobs.append(job)
            guard waited else { return [] }
            defer { held.jobs = [] }
            return held.jobs
        }
        if !handed.isEmpty { submit(handed) }
    }

    private func submit(_ jobs: [Job]) {
        if let error = failedWith {
            for job in jobs { job.done(error) }
            return
        }
        let accepted = queue.withLockNotifyingAll { state -> Bool in
            guard !state.stopping else { return false }
            state.jobs += jobs
            return true
        }
        if !accepted { for job in jobs { job.done(.database("the store is closed")) } }
    }

    /// The calling thread's jobs wait until it calls `release`, and then go over together, into
    /// one batch: the engine hands over a turn's ends and claims at once, not each as it comes.
    private let held = Locked(Hold())

    private struct Hold {
        var thread: pthread_t?
        var jobs: [Job] = []

        /// Whether the calling thread is the one holding.
        var isCaller: Bool { thread.map { pthread_equal($0, pthread_self()) != 0 } ?? false }
    }

    /// One thread holds at a time (the engine's).
    func hold() {
        held.withLock { held in
            precondition(held.thread == nil || held.isCaller, "one thread holds writes")
            held.thread = pthread_self()
        }
    }

    /// Hands the held jobs over; a thread that does not hold has none. Whether there were any.
    @discardableResult
    func release() -> Bool {
        let jobs = held.withLock { held -> [Job] in
            guard held.isCaller else { return [] }
            defer { held = Hold() }
            return held.jobs
        }
        if !jobs.isEmpty { submit(jobs) }
        return !jobs.isEmpty
    }

    /// Whether the calling thread holds jobs it has not handed over yet.
    var holdsJobs: Bool {
        held.withLock { $0.isCaller && !$0.jobs.isEmpty }
    }

    /// Runs `body` in the next batch and waits for its commit: the caller's answer is durable (or
    /// relaxed) once this returns.
    func perform<T>(durable: Bool, _ body: @escaping (Connection, ChangeRecorder) throws -> T) throws(StoreError) -> T {
        try begin(durable: durable, body).wait()
    }

    /// Hands `body` over for the next batch and returns at once; the caller is to wait for the
    /// result, so a holding thread's held jobs go over with it (`submit(_:waited:)`). `ended` runs
    /// after the commit (or the failure), before the result is given.
    func begin<T>(
        durable: Bool, _ body: @escaping (Connection, ChangeRecorder) throws -> T, ended: @escaping () -> Void = {}
    ) -> PendingWrite<T> {
        let outcome = PendingWrite<T>()
        submit(
            Job(
                durable: durable, body: { db, recorder in outcome.value = try body(db, recorder) },
                done: { error in
                    ended()
                    outcome.finish(error)
                }), waited: true)
        return outcome
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
    /// may therefore run twice: they write only through the connection and the change recorder, both
    /// rolled back in between.
    ///
    /// An error can also end the whole transaction (SQLite rolls it back itself after SQLITE_FULL,
    /// SQLITE_IOERR or SQLITE_NOMEM): then no job of the batch was written, and every one is told
    /// so; none runs after it (outside the transaction, each would commit on its own).
    private func commit(_ batch: [Job]) {
        var results = [StoreError?](repeating: nil, count: batch.count)
        if let error = failedWith {
            return handOver(Settlement(failed: batch, results: results, error: error))
        }
        let durable = batch.contains { $0.durable }
        do {
            try connection.run("BEGIN IMMEDIATE")
            var failed = false
            for job in batch {
                do { try job.body(connection, recorder) } catch {
                    guard connection.inTransaction else { throw error }
                    failed = true
                    break
                }
            }
            if failed {
                try connection.run("ROLLBACK")
                recorder.discard()
                try connection.run("BEGIN IMMEDIATE")
                for (index, job) in batch.enumerated() {
                    let mark = recorder.mark
                    try connection.run("SAVEPOINT job")
                    do {
                        try job.body(connection, recorder)
                        try connection.run("RELEASE job")
                    } catch {
                        guard connection.inTransaction else { throw error }
                        try connection.run("ROLLBACK TO job")
                        try connection.run("RELEASE job")
                        recorder.rollBack(to: mark)
                        onError?(error)
                        results[index] = StoreError(error)
                    }
                }
            }
            try flushCounts()
            try connection.run("COMMIT")
        } catch {
            if connection.inTransaction { _ = try? connection.run("ROLLBACK") }
            recorder.discard()
            onError?(error)
            return handOver(Settlement(failed: batch, results: results, error: StoreError(error)))
        }
        let (changes, files) = recorder.take()
        let settlement = Settlement(durable: durable, changes: changes, files: files, jobs: batch, results: results)
        afterCommit?(connection, settlement.needsSync)
        handOver(settlement)
    }

    /// Settles a batch that needs no sync here when nothing is before it, else queues it for the
    /// settler. Called on the writer's thread only (the one producer of settlements).
    private func handOver(_ settlement: Settlement) {
        let inline = settlements.withLockNotifyingAllIfNeeded { state -> (Bool, notify: Bool) in
            if !settlement.needsSync, state.pending.isEmpty, !state.busy {
                state.busy = true
                return (true, false)
            }
            state.pending.append(settlement)
            return (false, true)
        }
        guard inline else { return }
        act(on: settlement)
        settlements.withLock { $0.busy = false }
    }

    /// The settler's loop: everything committed so far, made durable when any of it must be,
    /// then acted on in commit order.
    private func settle() {
        while true {
            // The writer settles inline only while nothing is pending and the settler is not
            // busy: waiting for `busy` to clear keeps the two from overlapping.
            let (ready, stopping) = settlements.wait(
                until: { !$0.pending.isEmpty && !$0.busy || $0.stopping }, timeout: 3600
            ) { state -> ([Settlement], Bool) in
                // `busy` here is the writer's own (a wake by the timeout): leave it and take nothing.
                guard !state.busy, !state.pending.isEmpty else { return ([], state.stopping) }
                defer { state.pending.removeAll(keepingCapacity: true) }
                state.busy = true
                return (state.pending, state.stopping)
            }
            if !ready.isEmpty {
                if ready.contains(where: \.needsSync), let error = syncWAL() { fail(error) }
                for settlement in ready { act(on: settlement) }
                settlements.withLock { $0.busy = false }
            }
            if stopping, settlements.withLock({ $0.pending.isEmpty && !$0.busy }) { return }
        }
    }

    /// A committed batch's remaining work, after its sync when it needs one: the files it made
    /// final are removed, the observers see its changes, each job gets its result. Once the store
    /// failed, each job gets the failure instead, and nothing else is done.
    private func act(on settlement: Settlement) {
        if let error = failedWith {
            for job in settlement.jobs { job.done(error) }
            return
        }
        settlement.files.remove(through: fileRemover)
        if !settlement.changes.isEmpty {
            for observer in observers.withLock({ $0 }) { observer(settlement.changes) }
        }
        for (job, result) in zip(settlement.jobs, settlement.results) { job.done(result) }
    }

    /// `fdatasync` of the WAL file: every frame written before the call is on disk after it, or
    /// the error to fail the store with. The file is opened once, and again should it ever be a
    /// different file at that path; each time, the directory is synced too, so that the file's
    /// name is on disk with its frames (SQLite syncs the directory of a WAL it created only in a
    /// sync of its own, and its own syncs come at checkpoints).
    private func syncWAL() -> StoreError? {
        defer { walSyncs.withLock { $0 += 1 } }
        var current = stat()
        if walFile >= 0, stat(walPath, &current) == 0 {
            var held = stat()
            if fstat(walFile, &held) != 0 || held.st_ino != current.st_ino || held.st_dev != current.st_dev {
                close(walFile)
                walFile = -1
            }
        }
        if walFile < 0 {
            let file = open(walPath, O_RDONLY | O_CLOEXEC)
            guard file >= 0 else { return .syncFailed(SyncFailure(errno: errno, call: "open", path: walPath)) }
            if let failure = syncDirectory(of: walPath) { return .syncFailed(failure) }
            walFile = file
        }
        guard fdatasync(walFile) == 0 else {
            return .syncFailed(SyncFailure(errno: errno, call: "fdatasync", path: walPath))
        }
        return nil
    }
}
