import BackhaulCore
import Testing

/// Every rule of `TaskRecord.applying`, row by row: from a state, an input, at `now` → the state
/// it leads to (or a refusal) and what goes with it.
@Suite("Task transitions")
struct TaskTransitionTests {
    static let now: Timestamp = 1_000

    static func task(_ state: TaskState, _ reason: WaitingReason? = nil, attempts: Int = 1) -> TaskRecord {
        var task = TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/f", size: 100, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: "http://h/x", method: "PUT"), upload: UploadSpec(), createdAt: 0, deadlineAt: 5_000)
        task.state = state
        task.waitingReason = reason
        task.attempts = attempts
        if attempts > 0 { task.startedAt = 0 }
        return task
    }

    static let error = TaskError(.cannotConnectToHost, message: "refused")
    static let response = ResponseRecord(status: 201, headers: [], body: [])

    /// (from, waiting reason, input, expected state, expected reason); nil state: refused.
    static let rows: [(TaskState, WaitingReason?, TaskInput, TaskState?, WaitingReason?)] = [
        (.queued, nil, .attemptStarted, .running, nil),
        (.waiting, .scheduled, .attemptStarted, nil, nil),
        (.running, nil, .attemptEnded(attempt: 1, bytesTransferred: 100, .completed(response)), .completed, nil),
        (.running, nil, .attemptEnded(attempt: 2, bytesTransferred: 100, .completed(response)), nil, nil),
        (.cancelled, nil, .attemptEnded(attempt: 1, bytesTransferred: 100, .completed(response)), nil, nil),
        (.running, nil, .attemptEnded(attempt: 1, bytesTransferred: 0, .failed(error, nil)), .failed, nil),
        (.running, nil, .attemptEnded(attempt: 1, bytesTransferred: 0, .retry(at: 1_010, error, nil)), .retrying, nil),
        (.running, nil, .attemptEnded(attempt: 1, bytesTransferred: 0, .authenticationRequired(nil)), .authRequired, nil),
        (.running, nil, .attemptEnded(attempt: 1, bytesTransferred: 0, .interrupted), .queued, nil),
        (
            .running, nil, .attemptEnded(attempt: 1, bytesTransferred: 0, .held(.cellularNotAllowed)), .waiting,
            .cellularNotAllowed
        ),
        (
            .running, nil, .attemptEnded(attempt: 1, bytesTransferred: 0, .cancelled(.insufficientSystemResources, "full")),
            .cancelled, nil
        ),
        (.running, nil, .attemptEnded(attempt: 1, bytesTransferred: 0, .invalidConfiguration(error)), .failed, nil),
        (.running, nil, .requeued(counted: true), .queued, nil),
        (.queued, nil, .requeued(counted: false), nil, nil),
        (.queued, nil, .command(.cancel, .userCancelled), .cancelled, nil),
        (.running, nil, .command(.suspend, .userCancelled), .suspended, nil),
        (.suspended, nil, .command(.resume, .userCancelled), .queued, nil),
        (.queued, nil, .command(.resume, .userCancelled), nil, nil),
        (.completed, nil, .command(.cancel, .userCancelled), nil, nil),
        (.retrying, nil, .retryDue, .queued, nil),
        (.queued, nil, .retryDue, nil, nil),
        (.waiting, .scheduled, .scheduledDue, .queued, nil),
        (.waiting, .sessionDisabled, .scheduledDue, nil, nil),
        (.retrying, nil, .deadlinePassed, .failed, nil),
        (.authRequired, nil, .deadlinePassed, .failed, nil),
        (.failed, nil, .deadlinePassed, nil, nil),
        (.queued, nil, .policy(.wait(.cellularNotAllowed)), .waiting, .cellularNotAllowed),
        (.waiting, .cellularNotAllowed, .policy(.run), .queued, nil),
        (.waiting, .cellularNotAllowed, .policy(.fail(error)), .failed, nil),
        (.waiting, .sessionDisabled, .policy(.run), nil, nil),
        (.running, nil, .policy(.run), nil, nil),
        (.retrying, nil, .sessionEnabled(false), .waiting, .sessionDisabled),
        (.running, nil, .sessionEnabled(false), .waiting, .sessionDisabled),
        (.waiting, .sessionDisabled, .sessionEnabled(true), .queued, nil),
        (.suspended, nil, .sessionEnabled(false), nil, nil),
        (.authRequired, nil, .patched, .queued, nil),
        (.waiting, .cellularNotAllowed, .patched, .waiting, .cellularNotAllowed),
        (.completed, nil, .patched, nil, nil),
        (.waiting, .scheduled, .serviceCancelled(.backgroundUpdatesDisabled, nil), .cancelled, nil),
        (.cancelled, nil, .serviceCancelled(.backgroundUpdatesDisabled, nil), nil, nil),
    ]

    @Test("each input from each state", arguments: rows.indices)
    func row(_ index: Int) {
        let (from, reason, input, expected, expectedReason) = Self.rows[index]
        let result = Self.task(from, reason).applying(input, now: Self.now)
        switch (result, expected) {
        case (.success(let task), let state?):
            #expect(
                task.state == state && task.waitingReason == expectedReason, "row \(index): \(from) + \(input) → \(task.state)")
        case (.failure(let refused), nil):
            #expect(refused.state == from, "row \(index)")
        case (.success(let task), nil):
            Issue.record("row \(index): \(from) + \(input) should be refused, gave \(task.state)")
        case (.failure, let state?):
            Issue.record("row \(index): \(from) + \(input) should give \(state), was refused")
        }
    }

    @Test("what goes with each state: attempts, times, errors, last_error, the event")
    func fields() throws {
        let queued = Self.task(.queued, attempts: 0)
        let started = try queued.applying(.attemptStarted, now: 10).get()
        #expect(started.attempts == 1 && started.startedAt == 10 && TaskTransition.event(from: queued, to: started) == nil)
        let retrying = try started.applying(
            .attemptEnded(attempt: 1, bytesTransferred: 40, .retry(at: 20, Self.error, nil)), now: 11
        ).get()
        #expect(retrying.nextAttemptAt == 20 && retrying.lastError == LastError(Self.error, at: 11) && retrying.error == nil)
        #expect(retrying.bytesTransferred == 40)
        let again = try retrying.applying(.retryDue, now: 20).get().applying(.attemptStarted, now: 21).get()
        #expect(again.attempts == 2 && again.startedAt == 10 && again.nextAttemptAt == nil)
        let held = try again.applying(.attemptEnded(attempt: 2, bytesTransferred: 40, .held(.noConnectivity)), now: 22).get()
        #expect(held.attempts == 1, "a held attempt is not counted")
        #expect(TaskTransition.event(from: again, to: held) == .taskWaiting)
        let done = try held.applying(.policy(.run), now: 23).get().applying(.attemptStarted, now: 24).get()
            .applying(.attemptEnded(attempt: 2, bytesTransferred: 100, .completed(Self.response)), now: 25).get()
        #expect(done.finishedAt == 25 && done.response == Self.response && done.lastError == LastError(Self.error, at: 11))
        #expect(TaskTransition.event(from: held, to: done) == .taskCompleted && TaskTransition.finished(from: held, to: done))
        let cancelled = try Self.task(.running).applying(.command(.cancel, .backgroundUpdatesDisabled), now: 30).get()
        #expect(cancelled.cancellation == .backgroundUpdatesDisabled && cancelled.error?.code == -999)
        #expect(TaskTransition.releasesServerSide(from: Self.task(.running), to: cancelled))
        #expect(
            !TaskTransition.releasesServerSide(
                from: Self.task(.queued, attempts: 0),
                to: try Self.task(.queued, attempts: 0)
                    .applying(.command(.cancel, .userCancelled), now: 30).get()))
        // Its only attempt stopped by the policy (not counted), then cancelled: it began, so what it
        // may have left at the server is released.
        let heldFirst = try Self.task(.queued, attempts: 0).applying(.attemptStarted, now: 31).get()
            .applying(.attemptEnded(attempt: 1, bytesTransferred: 0, .held(.cellularNotAllowed)), now: 32).get()
        let heldCancelled = try heldFirst.applying(.command(.cancel, .userCancelled), now: 33).get()
        #expect(heldCancelled.attempts == 0 && TaskTransition.releasesServerSide(from: heldFirst, to: heldCancelled))
        let auth = try Self.task(.authRequired).applying(.deadlinePassed, now: 40).get()
        #expect(auth.error?.code == -1013 && auth.error?.httpStatus == 401)
        #expect(try Self.task(.retrying).applying(.deadlinePassed, now: 40).get().error?.code == -1001)
    }

    /// A resumed task goes back to where a new one would stand: waiting while its begin time is
    /// ahead, queued once it is past.
    @Test(
        "a resumed task waits for its earliest_begin_at",
        arguments: [
            (nil, TaskState.queued, nil),
            (2_000.0, .waiting, WaitingReason.scheduled),
            (500.0, .queued, nil),
        ] as [(Timestamp?, TaskState, WaitingReason?)])
    func resumedBeforeItsBegin(begin: Timestamp?, state: TaskState, reason: WaitingReason?) throws {
        var task = Self.task(.suspended)
        task.earliestBeginAt = begin
        let resumed = try task.applying(.command(.resume, .userCancelled), now: Self.now).get()
        #expect(resumed.state == state && resumed.waitingReason == reason)
    }

    /// An attempt a client stops is not counted, so a suspended task resumed later has the same
    /// count of attempts against its retry limit as before it ran.
    @Test("a client's suspend or cancel of a running task does not count its attempt")
    func clientStopsAreNotCounted() throws {
        let suspended = try Self.task(.running, attempts: 2).applying(.command(.suspend, .userCancelled), now: 10).get()
        #expect(suspended.state == .suspended && suspended.attempts == 1)
        let cancelled = try Self.task(.running, attempts: 2).applying(.command(.cancel, .userCancelled), now: 10).get()
        #expect(cancelled.state == .cancelled && cancelled.attempts == 1)
        let queued = try Self.task(.queued, attempts: 2).applying(.command(.suspend, .userCancelled), now: 10).get()
        #expect(queued.attempts == 2)
    }

    @Test(
        "a new task's first state",
        arguments: [
            (true, nil, nil, TaskState.queued, nil),
            (false, nil, nil, .waiting, WaitingReason.sessionDisabled),
            (true, 2_000.0, nil, .waiting, .scheduled),
            (true, 500.0, nil, .queued, nil),
            (true, nil, "no room", .cancelled, nil),
        ] as [(Bool, Timestamp?, String?, TaskState, WaitingReason?)])
    func admitted(enabled: Bool, begin: Timestamp?, quota: String?, state: TaskState, reason: WaitingReason?) {
        var task = Self.task(.queued, attempts: 0)
        task.earliestBeginAt = begin
        let admitted = task.admitted(sessionEnabled: enabled, quotaRefusal: quota, now: Self.now)
        #expect(admitted.state == state && admitted.waitingReason == reason)
        if quota != nil { #expect(admitted.cancellation == .insufficientSystemResources && admitted.error?.message == quota) }
    }
}

/// A record is a value though its fields sit behind a shared reference: a change to a copy (a field,
/// a nested field, a transition applied), leaves the original as it was.
@Suite("Task records are values")
struct TaskRecordValueTests {
    let original = TaskRecord(
        id: "t", sessionID: "s", file: FileInfo(path: "/f", size: 100, modifiedAtNanoseconds: 0),
        request: RequestSpec(url: "http://h/x", method: "PUT"), upload: UploadSpec(), createdAt: 0, deadlineAt: 5_000)

    @Test func aChangedCopyLeavesTheOriginal() {
        var copy = original
        #expect(copy == original)
        copy.state = .running
        copy.request.headers.append(("X-A", "1"))
        copy.attempts += 1
        #expect(original.state == .queued && original.request.headers.isEmpty && original.attempts == 0)
        #expect(copy.state == .running && copy.request.headers.count == 1 && copy.attempts == 1)
        #expect(copy != original)
        var again = copy
        again.state = .queued
        #expect(copy.state == .running)
        let shared = original
        guard case .success(let started) = shared.applying(.attemptStarted, now: 10) else {
            Issue.record("a queued task starts")
            return
        }
        #expect(started.state == .running && started.attempts == 1)
        #expect(shared.state == .queued && shared.attempts == 0 && original == shared)
    }

    @Test func equalFieldsAreEqualRecords() {
        var rebuilt = TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/f", size: 100, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: "http://h/x", method: "PUT"), upload: UploadSpec(), createdAt: 0, deadlineAt: 5_000)
        #expect(rebuilt == original)
        rebuilt.priority = 0.9
        #expect(rebuilt != original)
    }

    /// The host key is kept with the URL, and follows it when the URL changes.
    @Test func theHostKeyFollowsTheURL() {
        var copy = original
        #expect(copy.request.hostKey == "http://h:80")
        copy.request.url = "https://other.example:8443/y?z"
        #expect(copy.request.hostKey == "https://other.example:8443")
        #expect(original.request.hostKey == "http://h:80")
        #expect(RequestSpec(url: "not a url", method: "PUT").hostKey == "not a url")
    }
}
