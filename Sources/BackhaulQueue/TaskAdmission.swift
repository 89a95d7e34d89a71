import BackhaulCore

/// What admitting a batch's tasks carries from one task to the next: its session, the
/// idempotency keys the batch used, the bytes the session's unfinished tasks hold, and where the
/// driver numbers new tasks from.
public struct TaskAdmission {
    public let session: SessionRecord
    public var keys: [String: TaskRecord] = [:]
    /// Counted only when the session has a quota.
    public var held: Int64 = 0
    /// The driver's: the sequence the next new task gets, when it numbers them itself (0 until it
    /// has read where to start).
    public var nextSequence: Int64 = 0

    init(session: SessionRecord) { self.session = session }
}

/// Admission, quota and idempotency, written once over the driver.
extension StoreDriver {
    /// Opens a batch's admission in `tx`: the session must exist and be active, and at most
    /// `maxOpen` unfinished tasks may be in it afterwards (else `StoreError.tooManyTasks`), counted
    /// inside the transaction, so concurrent creates cannot pass the limit together.
    package func openAdmission(_ tx: Transaction, sessionID: String, adding count: Int, maxOpen: Int) throws
        -> TaskAdmission
    {
        guard let (session, open) = try admissionSession(tx, id: sessionID, countOpen: maxOpen < .max) else {
            throw StoreError.notFound
        }
        guard session.lifecycle == .active else {
            throw StoreError.conflict("the session is finishing and accepts no new tasks")
        }
        if open + count > maxOpen { throw StoreError.tooManyTasks(open: open, limit: maxOpen) }
        var admission = TaskAdmission(session: session)
        if session.configuration.quotaBytes != nil { admission.held = try heldBytes(tx, sessionID: sessionID) }
        return admission
    }

    /// Admits a part of a batch. Each task is decided in order: one its idempotency key names
    /// already is given back (not created); a new one is numbered and kept, and the kept ones are
    /// written together, then their events (a new task that has not ended has one at most:
    /// `task.waiting` in a disabled session). A task the session's quota refuses is created
    /// cancelled, which may drain the session: the tasks before it are written first and it alone
    /// after them, so the events stay in the tasks' order. `part.waitingJSON`, the API's rendering
    /// of each task as created waiting, is its event's data and its answer when it is created that
    /// way.
    package func admit(_ part: TaskBatch.Part, _ admission: inout TaskAdmission, _ tx: Transaction, now: Timestamp) throws
        -> [TaskBatch.Inserted]
    {
        let session = admission.session
        var results: [TaskBatch.Inserted] = []
        results.reserveCapacity(part.tasks.count)
        /// Where in `results` the new tasks not yet written are.
        var kept: [Int] = []
        func writeKept() throws {
            guard !kept.isEmpty else { return }
            try insertTasks(tx, results, at: kept)
            var events: [NewEvent] = []
            for position in kept {
                let (task, _, rendered) = results[position]
                if let type = TaskTransition.event(from: nil, to: task) {
                    events.append(NewEvent(type: type.rawValue, taskID: task.id, data: rendered ?? task.jsonText()))
                }
            }
            try appendEvents(tx, sessionID: session.id, events, now: now)
            noteCreated(tx, results, at: kept)
            kept.removeAll()
        }
        for (offset, draft) in part.tasks.enumerated() {
            if let key = draft.idempotencyKey {
                if let existing = try admission.keys[key] ?? taskByKey(tx, sessionID: session.id, idempotencyKey: key) {
                    results.append((existing, false, nil))
                    continue
                }
            }
            var refusal: String?
            if let quota = session.configuration.quotaBytes, admission.held + draft.file.size > quota {
                // The session's quota cannot keep it: it ends at once, and says why.
                refusal = "cancelled: the session's quota_bytes (\(quota)) cannot hold \(draft.file.size) more bytes"
            }
            var task = draft.admitted(sessionEnabled: session.enabled, quotaRefusal: refusal, now: now)
            task.sequence = try nextSequence(tx, &admission, remaining: part.tasks.count - offset)
            task.node = pin(for: task)
            if !task.state.isFinal { admission.held += task.file.size }
            if let key = task.idempotencyKey { admission.keys[key] = task }
            // `admitted` changes nothing else for a disabled session (and no refusal): the API's text
            // is this task's. The API's rendering knows no pin: a pinned task is rendered here.
            let rendered = !session.enabled && refusal == nil && task.node == nil ? part.waitingJSON?[offset] : nil
            results.append((task, true, rendered))
            if task.state.isFinal {
                try writeKept()
                try insertTasks(tx, results, at: [results.count - 1])
                try recorded(tx, from: nil, to: task, now: now, data: rendered)
            } else {
                kept.append(results.count - 1)
            }
        }
        try writeKept()
        return results
    }
}
