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
/// a run starts what it tells afresh, and `run` says which run committed.
///
/// The writer waits for the API's parts, and every other write waits behind it: the API only
/// validates between two parts (no store, no engine), and a part that does not come within
/// `partTimeout` (a file system that hangs) ends the batch with nothing of it written.
public final class TaskBatch: Sendable {
    /// Why the writer stopped reading parts before the end.
    public enum Stopped: Error, Sendable, Equatable {
        case abandoned
        case timedOut(seconds: Double)
    }

    /// How long the writer waits for the API's next part.
    let partTimeout: Double

    /// How many tasks the API will add in all (the open-task limit is checked against it first).
    public let count: Int

    /// A task the writer went through: the task as stored, whether this batch created it (else its
    /// idempotency key named one there already), and the API's `waitingJSON` for it when the writer
    /// wrote that text as its event (the task is then exactly as that text shows it).
    public typealias Inserted = (task: TaskRecord, created: Bool, json: String?)

    /// A part of the batch: its tasks as the API made them, and, when the API expects them to be
    /// created waiting for their disabled session, the JSON of each as created that way (the
    /// `task.waiting` event's data).
    package struct Part {
        package var tasks: [TaskRecord]
        package var waitingJSON: [String]?
    }

    private struct State {
        var parts: [Part] = []
        var closed = false
        /// The writer's run of the job, from 1, and what that run inserted, part by part.
        var run = 0
        var inserted: [[Inserted]] = []
        /// The job ended: committed, or failed (then `inserted` is not to be used).
        var ended = false
        /// Set by the API (abandoned) or by the writer (timed out); a later run stops at once.
        var stopped: Stopped?
    }

    private let state = Locked(State())

    /// Whether every part was there from the start (nothing can stop it half-way).
    package let isComplete: Bool

    public init(count: Int, partTimeout: Double = 10) {
        self.count = count
        self.partTimeout = partTimeout
        isComplete = false
    }

    /// A batch that is complete from the start (`waitingJSON` as in `add`).
    public init(_ tasks: [TaskRecord], waitingJSON: [String]? = nil) {
        precondition(waitingJSON == nil || waitingJSON?.count == tasks.count, "one JSON text a task")
        count = tasks.count
        partTimeout = 0
        isComplete = true
        state.withLock {
            $0.parts = [Part(tasks: tasks, waitingJSON: waitingJSON)]
            $0.closed = true
        }
    }

    // MARK: The API's side

    /// Adds a part; `waitingJSON`, when given, holds each task's JSON as `admitted` into a disabled
    /// session makes it, which the writer then writes as its event rather than render it again.
    public func add(_ part: [TaskRecord], waitingJSON: [String]? = nil) {
        precondition(waitingJSON == nil || waitingJSON?.count == part.count, "one JSON text a task")
        state.withLockNotifyingAll { $0.parts.append(Part(tasks: part, waitingJSON: waitingJSON)) }
    }

    /// Every part is in.
    public func close() { state.withLockNotifyingAll { $0.closed = true } }

    /// A task failed validation: the writer stops and writes none of the batch.
    public func abandon() { state.withLockNotifyingAll { $0.stopped = $0.stopped ?? .abandoned } }

    /// What the writer inserted of part `index`, once it did (in its current run: see `run`); nil
    /// when the job ended first (it failed; its error comes from the write itself).
    public func inserted(part index: Int, timeout: Double = 600) -> [Inserted]? {
        state.wait(until: { $0.inserted.count > index || $0.ended }, timeout: timeout) { state in
            state.inserted.count > index ? state.inserted[index] : nil
        }
    }

    /// The writer's run of the job so far (after the write's result: the run that committed).
    public var run: Int { state.withLock { $0.run } }

    /// Why the writer stopped before the end, if it did (then the batch wrote nothing).
    public var stopped: Stopped? { state.withLock { $0.stopped } }

    // MARK: The writer's side

    /// Starts a run of the job: what an earlier run inserted was rolled back.
    package func beginRun() {
        state.withLockNotifyingAll {
            $0.run += 1
            $0.inserted = []
        }
    }

    /// Part `index`, waiting for the API to add it; nil once the batch is closed and every part
    /// was read. Throws `Stopped` when the API abandoned the batch or let `timeout` pass without
    /// a part (then at once in any later run).
    package func part(_ index: Int) throws(Stopped) -> Part? {
        let timeout = partTimeout
        let (part, stopped) = state.wait(
            until: { $0.parts.count > index || $0.closed || $0.stopped != nil }, timeout: timeout
        ) { state -> (Part?, Stopped?) in
            if state.stopped == nil, state.parts.count <= index, !state.closed { state.stopped = .timedOut(seconds: timeout) }
            return (state.parts.count > index ? state.parts[index] : nil, state.stopped)
        }
        if let stopped { throw stopped }
        return part
    }

    /// The writer's run of the batch: each part admitted by `admit` as it comes, and what it
    /// created. A batch that was not whole from the start runs inside a savepoint (`run` executes
    /// the statements, the same in SQLite and PostgreSQL), so that one the API gives up on is
    /// undone alone: then `undo` takes the transaction's notes back, and nothing was created.
    package func insertParts(
        run: (String) throws -> Void, undo: () -> Void, admit: (Part) throws -> [Inserted]
    ) throws -> [(TaskRecord, Bool)] {
        var results: [(TaskRecord, Bool)] = []
        results.reserveCapacity(count)
        if !isComplete { try run("SAVEPOINT batch") }
        do {
            var index = 0
            while let part = try part(index) {
                let inserted = try admit(part)
                didInsert(inserted)
                results += inserted.lazy.map { ($0.task, $0.created) }
                index += 1
            }
            if !isComplete { try run("RELEASE batch") }
        } catch is Stopped {
            try run("ROLLBACK TO batch")
            try run("RELEASE batch")
            undo()
            return []
        }
        return results
    }

    func didInsert(_ results: [Inserted]) { state.withLockNotifyingAll { $0.inserted.append(results) } }

    /// The job ended (its result, or its error, is the write's).
    package func end() { state.withLockNotifyingAll { $0.ended = true } }
}
