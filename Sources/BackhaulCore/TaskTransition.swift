/// How an attempt ended, as the engine reports it (the engine decides retries with
/// `RetryPlanner`; this says what to record).
public enum AttemptEnd: Sendable, Equatable {
    case completed(ResponseRecord?)
    case failed(TaskError, ResponseRecord?)
    /// Failed with `error`; tried again at `at`.
    case retry(at: Timestamp, TaskError, ResponseRecord?)
    /// New credentials are wanted: the server answered 401, or `expired` it said they expired.
    case authenticationRequired(ResponseRecord?, expired: Bool = false)
    /// Stopped without fault (shutdown): back to the queue, no attempt counted.
    case interrupted
    /// Stopped because the policy no longer allows it: waiting, no attempt counted.
    case held(WaitingReason)
    /// Ended by the service itself (a download the disk cannot hold: reason 2).
    case cancelled(CancellationReason, String)
    /// Could not start: the task's own configuration cannot be applied (a store written by a
    /// build that allowed it).
    case invalidConfiguration(TaskError)

    /// What the attempt led to, for the task's attempt history.
    public var outcome: AttemptRecord.Outcome {
        switch self {
        case .completed: return .completed
        case .failed, .invalidConfiguration: return .failed
        case .retry, .authenticationRequired: return .retry
        case .interrupted, .held, .cancelled: return .stopped
        }
    }

    /// The error of a failed attempt: it becomes the task's `last_error`.
    public var error: TaskError? {
        switch self {
        case .failed(let error, _), .invalidConfiguration(let error), .retry(_, let error, _): return error
        case .authenticationRequired(let response, true):
            return AttemptFailure.credentialsExpired(status: response?.status ?? 403).error
        case .authenticationRequired:
            return TaskError(.userAuthenticationRequired, message: "the server answered 401", httpStatus: 401)
        case .completed, .interrupted, .held, .cancelled: return nil
        }
    }
}

/// Everything that moves a task between the states of OpenAPI/backhaul.yaml: one input, the task as it is,
/// and the time give the task as it must be. The store reads, applies and writes; the engine and
/// the API only say what happened. Each rule lives here once, table-tested row by row.
public enum TaskInput: Sendable, Equatable {
    /// The engine starts attempt `attempts + 1` of a queued task.
    case attemptStarted
    /// Attempt `attempt` ended after `bytesTransferred` acknowledged bytes. Refused when the task left
    /// that attempt meanwhile (cancelled, suspended, expired): a stale result writes nothing.
    case attemptEnded(attempt: Int, bytesTransferred: Int64, AttemptEnd)
    /// The store found it `running` with no transfer behind it (after a crash, or a lost write):
    /// back to the queue. `counted`: the interrupted attempt still counts (a crash), or not.
    case requeued(counted: Bool)
    /// A client's cancel, suspend or resume; a cancel carries its reason.
    case command(TaskCommand, CancellationReason)
    /// A retrying task's backoff ended.
    case retryDue
    /// A scheduled task's `earliest_begin_at` came.
    case scheduledDue
    /// The resource timeout (`deadline_at`) passed.
    case deadlinePassed
    /// The policy's decision for a queued task or one it holds.
    case policy(PolicyDecision)
    /// The session was disabled (its tasks wait), or enabled again (they go back to the queue).
    case sessionEnabled(Bool)
    /// A client changed the task (PATCH): new credentials release `auth_required`, a new
    /// `earliest_begin_at` holds or releases it.
    case patched
    /// The service cancels it (transfers disabled, a quota, a full disk).
    case serviceCancelled(CancellationReason, String?)
}

extension TaskRecord {
    /// An attempt count moved by `change`, kept within 0...Int.max: the count comes from the
    /// stored row as it is, and one that is out of range must not trap the store's writer (the
    /// daemon would meet the same row at every start).
    static func counted(_ attempts: Int, plus change: Int) -> Int {
        let (sum, overflow) = attempts.addingReportingOverflow(change)
        return overflow ? (change > 0 ? .max : 0) : max(0, sum)
    }

    /// The task after `input` at `now`, or why the input does not apply.
    public func applying(_ input: TaskInput, now: Timestamp) -> Result<TaskRecord, TransitionRefused> {
        var task = self
        func refused(_ name: String) -> Result<TaskRecord, TransitionRefused> {
            .failure(TransitionRefused(state: state, input: name))
        }
        switch input {
        case .attemptStarted:
            guard state == .queued else { return refused("start") }
            task.enter(.running, now: now)
            task.attempts = Self.counted(task.attempts, plus: 1)
            if task.startedAt == nil { task.startedAt = now }

        case .attemptEnded(let attempt, let bytesTransferred, let end):
            guard state == .running, attempts == attempt else { return refused("end an attempt") }
            task.bytesTransferred = bytesTransferred
            if let error = end.error { task.lastError = LastError(error, at: now) }
            switch end {
            case .completed(let response):
                task.enter(.completed, now: now)
                task.response = response
                if download == nil { task.bytesTransferred = file.size }
            case .failed(let error, let response):
                task.enter(.failed, now: now)
                task.error = error
                if let response { task.response = response }
            case .invalidConfiguration(let error):
                task.enter(.failed, now: now)
                task.error = error
            case .retry(let at, _, let response):
                task.enter(.retrying, now: now)
                task.nextAttemptAt = at
                if let response { task.response = response }
            case .authenticationRequired(let response, _):
                task.enter(.authRequired, now: now)
                if let response { task.response = response }
            case .interrupted:
                task.enter(.queued, now: now)
                task.attempts = Self.counted(task.attempts, plus: -1)
            case .held(let reason):
                task.enter(.waiting, now: now, waitingReason: reason)
                task.attempts = Self.counted(task.attempts, plus: -1)
            case .cancelled(let reason, let message):
                task.cancel(reason, now: now, message: message)
            }

        case .requeued(let counted):
            guard state == .running else { return refused("requeue") }
            task.enter(.queued, now: now)
            if !counted { task.attempts = Self.counted(task.attempts, plus: -1) }

        case .command(let command, let reason):
            // A running attempt a client stops (suspend, cancel) is listed but not counted, as a
            // policy hold or a shutdown is not (docs/concepts.md).
            if state == .running, command != .resume { task.attempts = Self.counted(task.attempts, plus: -1) }
            switch state.applying(command) {
            case .failure(let refusal): return .failure(refusal)
            case .success(.cancelled): task.cancel(reason, now: now)
            // A resumed task stands where a new one would: waiting while its begin time is ahead.
            case .success(.queued) where (task.earliestBeginAt ?? now) > now:
                task.enter(.waiting, now: now, waitingReason: .scheduled)
            case .success(let next): task.enter(next, now: now)
            }

        case .retryDue:
            guard state == .retrying else { return refused("retry") }
            task.enter(.queued, now: now)

        case .scheduledDue:
            guard state == .waiting, waitingReason == .scheduled else { return refused("begin") }
            task.enter(.queued, now: now)

        case .deadlinePassed:
            guard !state.isFinal else { return refused("expire") }
            let wasAuth = state == .authRequired
            task.enter(.failed, now: now)
            if !wasAuth {
                task.error = TaskError(.timedOut, message: "the resource timeout was reached")
            } else if authReason == .credentialsExpired {
                task.error = TaskError(
                    .userAuthenticationRequired,
                    message: "the credentials expired and no new ones (nor a new URL) came before the resource timeout",
                    httpStatus: lastError?.error.httpStatus, reason: .credentialsExpired)
            } else {
                task.error = TaskError(
                    .userAuthenticationRequired,
                    message: "the server asked for authentication and no new credentials came before the resource timeout",
                    httpStatus: 401)
            }

        case .policy(let decision):
            guard state == .queued || state == .waiting && Policy.reasons.contains(waitingReason ?? .scheduled) else {
                return refused("decide by policy")
            }
            switch decision {
            case .run: task.enter(.queued, now: now)
            case .wait(let reason): task.enter(.waiting, now: now, waitingReason: reason)
            case .fail(let error):
                task.enter(.failed, now: now)
                task.error = error
            }

        case .sessionEnabled(let enabled):
            if !enabled, [.queued, .running, .retrying].contains(state) {
                task.enter(.waiting, now: now, waitingReason: .sessionDisabled)
            } else if enabled, state == .waiting, waitingReason == .sessionDisabled {
                task.enter(.queued, now: now)
            } else {
                return refused(enabled ? "enable" : "disable")
            }

        case .patched:
            guard !state.isFinal else { return refused("change") }
            if task.state == .authRequired { task.enter(.queued, now: now) }
            if task.state == .waiting, task.waitingReason == .scheduled, (task.earliestBeginAt ?? 0) <= now {
                task.enter(.queued, now: now)
            } else if task.state == .queued, let begin = task.earliestBeginAt, begin > now {
                task.enter(.waiting, now: now, waitingReason: .scheduled)
            }

        case .serviceCancelled(let reason, let message):
            guard !state.isFinal else { return refused("cancel") }
            task.cancel(reason, now: now, message: message)
        }
        return .success(task)
    }

    /// A new task's first state (OpenAPI/backhaul.yaml): cancelled with reason 2 when its session's quota
    /// cannot hold it, waiting while its session is disabled or before `earliest_begin_at`,
    /// else queued.
    public func admitted(sessionEnabled: Bool, quotaRefusal: String?, now: Timestamp) -> TaskRecord {
        var task = self
        if let quotaRefusal {
            task.cancel(.insufficientSystemResources, now: now, message: quotaRefusal)
        } else if !sessionEnabled {
            task.enter(.waiting, now: now, waitingReason: .sessionDisabled)
        } else if let begin = earliestBeginAt, begin > now {
            task.enter(.waiting, now: now, waitingReason: .scheduled)
        } else {
            task.enter(.queued, now: now)
        }
        return task
    }

    /// Points a task that is not running at a new URL and method (docs/credentials.md, PATCH). A resumable
    /// upload starts a new upload resource there: what it knew of the old one goes (its release is
    /// the store's, `TaskTransition.abandonsUploadResource`). `chunked` keeps its offset, so that
    /// its next attempt first asks the new URL where it stands. A download starts over.
    public mutating func retarget(url: String, method: String) {
        guard url != request.url || method != request.method else { return }
        request.url = url
        request.method = method
        guard kind == .download || upload.protocolName != .chunked else { return }
        checkpoint = nil
        bytesTransferred = 0
    }

    /// Sets the state and the fields that go with it.
    mutating func enter(_ next: TaskState, now: Timestamp, waitingReason reason: WaitingReason? = nil) {
        state = next
        waitingReason = next == .waiting ? reason : nil
        if next != .retrying { nextAttemptAt = nil }
        if next.isFinal { finishedAt = now }
    }

    /// Ends the task as cancelled, saying why (OpenAPI/backhaul.yaml); the message defaults to the reason's name.
    mutating func cancel(_ reason: CancellationReason, now: Timestamp, message: String? = nil) {
        enter(.cancelled, now: now)
        cancellation = reason
        error = TaskError(.cancelled, message: message ?? "cancelled: \(reason.name)")
    }
}

/// What a change of a task calls for besides its record (OpenAPI/backhaul.yaml).
public enum TaskTransition {
    /// The `task.*` event a change from `before` (nil: created) to `after` records, if any: a new
    /// state, or a new waiting reason.
    public static func event(from before: TaskRecord?, to after: TaskRecord) -> EventType? {
        guard before?.state != after.state || before?.waitingReason != after.waitingReason else { return nil }
        return EventType.forTaskState(after.state)
    }

    /// Whether the change cancelled a task that may have left something at its server (an attempt
    /// began, or it holds a resumable upload): its protocol's release is queued with it. An attempt
    /// that began is known by `startedAt`, not by `attempts`, which leaves out the attempts a
    /// policy hold, a shutdown or a client stopped.
    public static func releasesServerSide(from before: TaskRecord?, to after: TaskRecord) -> Bool {
        after.state == .cancelled && before?.state.isFinal != true && (after.startedAt != nil || after.checkpoint != nil)
    }

    /// Whether a change of the task's URL or method (PATCH) leaves an upload resource at the old
    /// one (a tus or IETF upload, an S3 multipart upload): it is released as on cancel, queued with
    /// the change.
    public static func abandonsUploadResource(from before: TaskRecord, to after: TaskRecord) -> Bool {
        before.request.url != after.request.url || before.request.method != after.request.method
            ? before.checkpoint?.location != nil : false
    }

    /// Whether the change ended the task (its session may now be drained).
    public static func finished(from before: TaskRecord?, to after: TaskRecord) -> Bool {
        after.state.isFinal && before?.state.isFinal != true
    }
}
