import BackhaulCore

/// What one commit changed that others act on, handed to the store's observers after the commit
/// (`Store.observe`): the engine keeps its queue from it and stops transfers whose task moved on;
/// the webhook dispatcher and the event stream wake on new events.
///
/// Task changes are reported by `TaskRows`, the only code that writes tasks (`TaskFeed`), so no
/// code path can change a task without them; a write that is rolled back takes its changes back.
public struct StoreChanges: Sendable {
    /// Tasks that entered the queue, or changed while in it (priority, host, own limit).
    public var queued: [Scheduler.Entry] = []
    /// Tasks that left the queue (any other state, or deleted), by sequence.
    public var unqueued: [Int64] = []
    /// Tasks that left `running` (the engine's own ends included), by id.
    public var leftRunning: [String] = []
    /// The earliest timer a changed task now waits for (a retry, a scheduled start, a deadline).
    public var earliestTimer: Timestamp?
    /// Events were appended (the event stream has news).
    public var eventsAppended = false
    /// Deliveries of them were queued (the outbox has work for the webhook dispatcher).
    public var deliveriesAdded = false
    /// Cleanups (server-side releases of cancelled tasks) were queued.
    public var cleanupsAdded = false
    /// Sessions created, changed or removed.
    public var sessions: Set<String> = []
    /// Settings (`network_override`, `policy`) set or removed.
    public var settings: Set<String> = []
    /// Tasks or events removed by retention or by a client (for the counters).
    public var pruned = 0
    /// A task the policy may hold changed its own configuration: decide again for held tasks.
    public var policyReview = false
    /// Tasks created queued, as written: the engine may start them without reading them back.
    public var created: [TaskRecord] = []
    /// Queued tasks whose row was changed (a client's PATCH, new headers) and that stay queued:
    /// a copy of one from `created` is out of date.
    public var touched: [Int64] = []
    /// Anything may have changed in ways not listed here (another node's changes were missed while
    /// this node's `LISTEN` was down, or were too many to spell out): every reader reads its part
    /// again, the queue, sessions, settings, events and the outbox (docs/fleet.md).
    public var queueReload = false

    public init() {}

    public var isEmpty: Bool {
        queued.isEmpty && unqueued.isEmpty && leftRunning.isEmpty && earliestTimer == nil && !eventsAppended && !cleanupsAdded
            && sessions.isEmpty && settings.isEmpty && pruned == 0 && !policyReview && created.isEmpty && touched.isEmpty
            && !queueReload
    }

    package mutating func noteTimer(_ time: Timestamp?) {
        guard let time else { return }
        earliestTimer = min(earliestTimer ?? time, time)
    }

    /// Appends what `later` changed after this.
    package mutating func merge(_ later: StoreChanges) {
        queued += later.queued
        unqueued += later.unqueued
        leftRunning += later.leftRunning
        noteTimer(later.earliestTimer)
        eventsAppended = eventsAppended || later.eventsAppended
        deliveriesAdded = deliveriesAdded || later.deliveriesAdded
        cleanupsAdded = cleanupsAdded || later.cleanupsAdded
        sessions.formUnion(later.sessions)
        settings.formUnion(later.settings)
        pruned += later.pruned
        policyReview = policyReview || later.policyReview
        created += later.created
        touched += later.touched
        queueReload = queueReload || later.queueReload
    }
}

extension StoreChanges {
    /// Whether a task's change from `before` to `after` is one the observers hear of: its state,
    /// or what the queue, the timers or the policy read.
    package static func concerns(from before: TaskRecord, to after: TaskRecord) -> Bool {
        before.configurationOverrides != after.configurationOverrides || before.state != after.state
            || before.priority != after.priority || before.request != after.request
            || before.nextAttemptAt != after.nextAttemptAt || before.earliestBeginAt != after.earliestBeginAt
            || before.deadlineAt != after.deadlineAt
    }

    /// Notes a task written from `before` (nil: created) to `after`: the queue it enters or leaves,
    /// a transfer to stop, its timers, a policy review.
    package mutating func note(from before: TaskRecord?, to after: TaskRecord) {
        if after.state == .queued {
            let key = Scheduler.Key(session: after.sessionID, host: after.request.hostKey)
            let limit = after.configurationOverrides["max_connections_per_host"]?.intValue.map { Int($0) }
            queued.append(Scheduler.Entry(sequence: after.sequence, priority: after.priority, key: key, limit: limit))
        } else if before?.state == .queued {
            unqueued.append(after.sequence)
        }
        if before?.state == .running, after.state != .running { leftRunning.append(after.id) }
        if after.state == .retrying { noteTimer(after.nextAttemptAt) }
        if after.state == .waiting { noteTimer(after.earliestBeginAt) }
        if !after.state.isFinal { noteTimer(after.deadlineAt) }
        // A held task whose own configuration changed may be allowed now: the policy decides again.
        if let before, before.configurationOverrides != after.configurationOverrides, after.state == .waiting {
            policyReview = true
        }
    }
}
