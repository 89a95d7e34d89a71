import BackhaulCore
import Threads

/// A batch of new tasks handed to the store a part at a time, while the API still validates the
/// rest: the writer inserts each part as it comes, inside the batch's one transaction, and says
/// what it inserted part by part, so that the answer is written while later parts go in. Nothing
/// commits before the API closes the batch; a batch the API abandons (a task failed validation)
/// writes nothing.
///
/// The writer may run a job twice (a job after it in the same transaction threw: the transaction
/// is run again with a savepoint per job). Parts are kept, so the second run reads them again;
/// what each run inserted is told with its number, and only the committed run's counts.
public final class TaskBatch: Sendable {
    /// How many tasks the API will add in all (the open-task limit is checked against it first).
    public let count: Int

    private struct State {
        var parts: [[TaskRecord]] = []
        var closed = false
        var abandoned = false
        /// The writer's run of the job, from 1, and what that run inserted, part by part.
        var run = 0
        var inserted: [[(TaskRecord, Bool)]] = []
        /// The job ended: committed, or failed (then `inserted` is not to be used).
        var ended = false
    }

    private let state = Locked(State())

    public init(count: Int) { self.count = count }

    /// A batch that is complete from the start.
    public convenience init(_ tasks: [TaskRecord]) {
        self.init(count: tasks.count)
        add(tasks)
        close()
    }

    // MARK: The API's side

    public func add(_ part: [TaskRecord]) { state.withLockNotifyingAll { $0.parts.append(part) } }

    /// Every part is in.
    public func close() { state.withLockNotifyingAll { $0.closed = true } }

    /// A task failed validation: the writer stops and writes none of the batch.
    public func abandon() { state.withLockNotifyingAll { $0.abandoned = true } }

    /// What the writer inserted of part `index` and in which run, once it did; nil when the job
    /// ended first (it failed; its error comes from the write itself).
    public func inserted(part index: Int, timeout: Double = 600) -> (results: [(TaskRecord, Bool)], run: Int)? {
        state.wait(until: { $0.inserted.count > index || $0.ended }, timeout: timeout) { state in
            state.inserted.count > index ? (state.inserted[index], state.run) : nil
        }
    }

    /// The writer's run of the job so far (after the write's result: the run that committed).
    public var run: Int { state.withLock { $0.run } }

    // MARK: The writer's side

    /// Starts a run of the job: what an earlier run inserted was rolled back.
    func beginRun() {
        state.withLockNotifyingAll {
            $0.run += 1
            $0.inserted = []
        }
    }

    /// Part `index`, waiting for the API to add it; nil once the batch is closed and every part
    /// was read. Throws when the API abandoned the batch, or stopped adding parts for `timeout`.
    func part(_ index: Int, timeout: Double = 60) throws -> [TaskRecord]? {
        let (part, abandoned, waiting) = state.wait(
            until: { $0.parts.count > index || $0.closed || $0.abandoned }, timeout: timeout
        ) { state in
            (state.parts.count > index ? state.parts[index] : nil, state.abandoned, !state.closed && state.parts.count <= index)
        }
        if abandoned { throw StoreError.invalid(ValidationError("tasks", "the batch was abandoned")) }
        if waiting { throw StoreError.database("the batch's next part did not come in \(Int(timeout)) s") }
        return part
    }

    func inserted(_ results: [(TaskRecord, Bool)]) { state.withLockNotifyingAll { $0.inserted.append(results) } }

    /// The job ended (its result, or its error, is the write's); returns the run that it ended in.
    @discardableResult
    func end() -> Int {
        state.withLockNotifyingAll {
            $0.ended = true
            return $0.run
        }
    }
}
