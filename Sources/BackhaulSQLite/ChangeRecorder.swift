import BackhaulCore
import BackhaulQueue

/// The changes of the open transaction, as `TaskFeed` and the store's own code note them; used on
/// the writer's thread only.
final class ChangeRecorder {
    private(set) var changes = StoreChanges()
    /// What the writer keeps between transactions; its marks are only cleared by a commit.
    let state: WriterState
    /// Tasks whose `touchedQueued` / `patchedWhileRunning` mark this transaction settled (their
    /// claim or end read the row): the marks go when it commits, and stay if it is rolled back,
    /// so a batch run again after a failure reads the rows again too.
    private var settledTouched: [Int64] = []
    private var settledPatched: [Int64] = []
    /// Files removed once the transaction's commit is durable.
    private(set) var files = FileRemovals()

    /// Changes of the per-session task counts not yet written to `session_counts`, by session and
    /// state: written once per transaction (`flushCounts`), read with the table meanwhile.
    private(set) var countDeltas: [String: [String: Int]] = [:]

    init(state: WriterState) { self.state = state }

    /// What is there now, to undo a savepoint that is rolled back.
    struct Mark {
        fileprivate let changes: StoreChanges
        fileprivate let files: Int
        fileprivate let counts: [String: [String: Int]]
        fileprivate let settled: (touched: Int, patched: Int)
    }

    var mark: Mark {
        Mark(
            changes: changes, files: files.count, counts: countDeltas,
            settled: (settledTouched.count, settledPatched.count))
    }

    func rollBack(to mark: Mark) {
        changes = mark.changes
        files.rollBack(to: mark.files)
        countDeltas = mark.counts
        settledTouched.removeSubrange(mark.settled.touched...)
        settledPatched.removeSubrange(mark.settled.patched...)
    }

    /// A queued task's row changed and it stays queued: the engine's copy of it is out of date
    /// (the observers hear so). Marked at once (an extra mark only costs a read); a settling earlier
    /// in this transaction no longer holds.
    func markTouched(_ sequence: Int64) {
        state.touchedQueued.insert(sequence)
        settledTouched.removeAll { $0 == sequence }
        changes.touched.append(sequence)
    }

    /// A running task's row was changed by a client: its end reads the row again.
    func markPatched(_ sequence: Int64) {
        state.patchedWhileRunning.insert(sequence)
        settledPatched.removeAll { $0 == sequence }
    }

    /// The queued task's row was read again (or it left the queue): its mark goes at the commit.
    func settleTouched(_ sequence: Int64) { settledTouched.append(sequence) }

    /// The running task's end read its row again: its mark goes at the commit.
    func settlePatched(_ sequence: Int64) { settledPatched.append(sequence) }

    /// A task moved from (`oldSession`, `oldState`) to (`newSession`, `newState`); nil: it was
    /// created, or deleted. Tasks of no session ('') are not counted.
    func countMove(from oldSession: String?, _ oldState: String?, to newSession: String?, _ newState: String?) {
        if let oldSession, let oldState, !oldSession.isEmpty { countDeltas[oldSession, default: [:]][oldState, default: 0] -= 1 }
        if let newSession, let newState, !newSession.isEmpty { countDeltas[newSession, default: [:]][newState, default: 0] += 1 }
    }

    /// Unfinished tasks per session as committed in `session_counts`: read from the table once
    /// per session, then kept as the counts are written, so that a task's end learns whether its
    /// session is drained without a query. Forgotten whenever a transaction fails.
    private var committedOpen: [String: Int] = [:]

    /// Pending count changes of one session's states.
    func pendingCounts(_ session: String) -> [String: Int] { countDeltas[session] ?? [:] }

    /// The session's unfinished tasks with what the open transaction changed; `committed` reads
    /// the table when the number is not known yet.
    func openCount(_ session: String, committed: () throws -> Int) rethrows -> Int {
        let base: Int
        if let known = committedOpen[session] {
            base = known
        } else {
            base = try committed()
            committedOpen[session] = base
        }
        return base + Self.openDelta(countDeltas[session] ?? [:])
    }

    private static func openDelta(_ deltas: [String: Int]) -> Int {
        deltas.reduce(0) { sum, entry in sum + (TaskState(rawValue: entry.key).map { $0.isFinal ? 0 : entry.value } ?? 0) }
    }

    /// The session's rows go: its pending count changes with them.
    func forgetCounts(_ session: String) {
        countDeltas[session] = nil
        committedOpen[session] = nil
    }

    /// Takes the pending count changes (to write them, just before the commit).
    func takeCounts() -> [String: [String: Int]] {
        for (session, deltas) in countDeltas where committedOpen[session] != nil {
            committedOpen[session]! += Self.openDelta(deltas)
        }
        defer { countDeltas = [:] }
        return countDeltas
    }

    func update(_ body: (inout StoreChanges) -> Void) { body(&changes) }

    /// Notes the files a task's change leaves to remove (`FileRemovals`).
    func noteFiles(from before: TaskRecord?, to after: TaskRecord) { files.note(from: before, to: after) }

    /// Everything collected (the transaction committed), and a fresh record for the next one.
    func take() -> (StoreChanges, files: FileRemovals) {
        state.touchedQueued.subtract(settledTouched)
        state.patchedWhileRunning.subtract(settledPatched)
        settledTouched = []
        settledPatched = []
        defer {
            changes = StoreChanges()
            files = FileRemovals()
        }
        return (changes, files)
    }

    func discard() {
        settledTouched = []
        settledPatched = []
        _ = take()
        countDeltas = [:]
        committedOpen = [:]
    }
}
