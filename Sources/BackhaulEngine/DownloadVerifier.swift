import BackhaulCore
import BackhaulFiles
import Glibc
import Threads

/// Makes finished downloads durable and checks them off the engine thread: `fdatasync` of the
/// `.part` file and its SHA-256 take about half a second per GiB, which on the engine thread
/// (inside its store batch) stalled every other transfer and every API read. The engine hands a
/// job over and goes on; the answer comes back through `take`, and the engine, if the task is still
/// its own, renames the file into place.
final class DownloadVerifier: @unchecked Sendable {
    // @unchecked: a job's PartFile is handed over whole; the engine does not touch it (but to
    // close it) until the job's outcome is back, and both queues are behind their locks.
    struct Job {
        let taskID: String
        let attempt: Int
        let part: PartFile
        let expectedSHA256: String?
    }

    struct Outcome {
        let taskID: String
        let attempt: Int
        /// Nil when the file is durable and, if a digest was expected, has it.
        let error: TaskError?
    }

    private let jobs = Locked<(pending: [Job], stopping: Bool)>(([], false))
    private let outcomes = Locked<[Outcome]>([])
    private let thread = WorkerThread(name: "bh-verifier")
    private let wake: @Sendable () -> Void

    /// `wake` is called (on the verifier's thread) after each outcome is ready.
    init(wake: @escaping @Sendable () -> Void) {
        self.wake = wake
    }

    func start() {
        thread.start { [self] in run() }
    }

    /// Finishes the job in hand and stops.
    func stop() {
        jobs.withLockNotifyingAll { $0.stopping = true }
        thread.join()
    }

    func submit(_ job: Job) {
        jobs.withLockNotifyingAll { $0.pending.append(job) }
    }

    var hasOutcomes: Bool { outcomes.withLock { !$0.isEmpty } }

    /// The outcomes ready since the last call.
    func take() -> [Outcome] {
        outcomes.withLock { ready in
            defer { ready.removeAll() }
            return ready
        }
    }

    private func run() {
        while true {
            let job: Job? = jobs.wait(until: { !$0.pending.isEmpty || $0.stopping }, timeout: 60) { state in
                state.pending.isEmpty ? nil : state.pending.removeFirst()
            }
            guard let job else {
                if jobs.withLock({ $0.stopping }) { return }
                continue
            }
            let error = Self.verify(job)
            outcomes.withLock { $0.append(Outcome(taskID: job.taskID, attempt: job.attempt, error: error)) }
            wake()
        }
    }

    /// The `.part` file synced to disk and, when a digest is expected, hashed and compared.
    static func verify(_ job: Job) -> TaskError? {
        let part = job.part
        guard part.sync() else {
            return TaskError(.cannotWriteToFile, message: "cannot sync \(part.path): \(String(cString: strerror(errno)))")
        }
        guard let expected = job.expectedSHA256 else { return nil }
        guard let actual = part.sha256() else {
            return TaskError(.cannotWriteToFile, message: "cannot read back \(part.path) to verify it")
        }
        guard actual == expected else {
            return TaskError(
                .downloadChecksumMismatch,
                message: "the downloaded file's SHA-256 is \(actual), expected_sha256 is \(expected); nothing was placed")
        }
        return nil
    }
}
