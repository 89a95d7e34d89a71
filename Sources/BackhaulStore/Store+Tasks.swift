import BackhaulCore
import JSONCodec
import SQLite

/// A queued task as the scheduler sees it.
public struct QueueEntry: Sendable, Equatable {
    public var sequence: Int64
    public var id: String
    public var sessionID: String
    /// scheme://host:port of the request URL.
    public var hostKey: String
    public var priority: Double
    public var configurationOverrides: JSONObject
}

/// How an engine attempt ended, to be written if the task is still the engine's.
public enum AttemptResult: Sendable {
    case completed(ResponseRecord?)
    case failed(TaskError, ResponseRecord?)
    /// Failed with `error`; tried again at `at`.
    case retry(at: Timestamp, TaskError, ResponseRecord?)
    case authenticationRequired(ResponseRecord?)
    /// Stopped without fault (shutdown): back to the queue, no attempt counted.
    case interrupted
    /// Stopped because the policy no longer allows it: waiting, no attempt counted.
    case held(WaitingReason)
    /// Ended by the service itself (a download the disk cannot hold: reason 2).
    case cancelled(CancellationReason, String)
    /// Failed before it could start: the task's own configuration cannot be applied (a store
    /// written by a build that allowed it).
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
    public var attemptError: TaskError? {
        switch self {
        case .failed(let error, _), .invalidConfiguration(let error): return error
        case .retry(_, let error, _):
            return error
        case .authenticationRequired:
            return TaskError(.userAuthenticationRequired, message: "the server answered 401", httpStatus: 401)
        case .completed, .interrupted, .held, .cancelled:
            return nil
        }
    }
}

extension Store {
    static let taskColumns = """
        seq, id, session_id, kind, state, waiting_reason, file_path, file_size, file_mtime_ns, request, upload, \
        priority, description, idempotency_key, delete_file_on_success, configuration, attempts, bytes_sent, \
        created_at, started_at, finished_at, next_attempt_at, earliest_begin_at, deadline_at, response, error, \
        cancellation, checkpoint, download, detached_from, last_error
        """

    static func decodeTask(_ row: Row) throws -> TaskRecord {
        let requestJSON = try JSON.parse(row.string(9), maxDepth: 64)
        var headers: [(String, String)] = []
        for (name, value) in requestJSON["headers"]?.objectValue ?? [:] { headers.append((name, value.stringValue ?? "")) }
        let request = RequestSpec(url: requestJSON["url"]?.stringValue ?? "", method: requestJSON["method"]?.stringValue ?? "PUT",
                                  headers: headers)
        let upload = try UploadSpec.decode(JSON.parse(row.string(10), maxDepth: 64))
        // A task whose session was removed keeps the id it had (`detached_from`).
        var task = TaskRecord(
            id: row.string(1), sessionID: row.optionalString(29) ?? row.string(2),
            file: FileInfo(path: row.string(6), size: row.int(7), modifiedAtNanoseconds: row.int(8)),
            request: request, upload: upload, createdAt: row.double(18), deadlineAt: row.double(23))
        task.sequence = row.int(0)
        guard let kind = TaskKind(rawValue: row.string(3)), let state = TaskState(rawValue: row.string(4)) else {
            throw StoreError.corrupt("task \(task.id) has kind \(row.string(3)) and state \(row.string(4))")
        }
        task.kind = kind
        task.state = state
        if let reason = row.optionalString(5) {
            guard let parsed = WaitingReason(rawValue: reason) else {
                throw StoreError.corrupt("task \(task.id) waits for the reason \(reason)")
            }
            task.waitingReason = parsed
        }
        task.priority = row.double(11)
        task.description = row.optionalString(12)
        task.idempotencyKey = row.optionalString(13)
        task.deleteFileOnSuccess = row.int(14) != 0
        task.configurationOverrides = try overrides(row.string(15), task: task.id)
        task.attempts = Int(row.int(16))
        task.bytesSent = row.int(17)
        task.startedAt = row.optionalDouble(19)
        task.finishedAt = row.optionalDouble(20)
        task.nextAttemptAt = row.optionalDouble(21)
        task.earliestBeginAt = row.optionalDouble(22)
        task.response = try row.optionalString(24).flatMap { ResponseRecord.decode(try JSON.parse($0, maxDepth: 64)) }
        task.error = try row.optionalString(25).flatMap { TaskRecord.decodeError(try JSON.parse($0, maxDepth: 16)) }
        task.cancellation = row.optionalInt(26).flatMap { CancellationReason(rawValue: Int($0)) }
        if let text = row.optionalString(27) {
            guard let checkpoint = UploadCheckpoint(try JSON.parse(text, maxDepth: 16)) else {
                throw StoreError.corrupt("task \(task.id) has the checkpoint \(text)")
            }
            task.checkpoint = checkpoint
        }
        if let text = row.optionalString(28) {
            guard let download = DownloadSpec(try JSON.parse(text, maxDepth: 16)) else {
                throw StoreError.corrupt("task \(task.id) has the download \(text)")
            }
            task.download = download
        }
        task.lastError = try row.optionalString(30).flatMap { LastError.decode(try JSON.parse($0, maxDepth: 16)) }
        return task
    }

    /// A task's stored configuration overrides: an object ("{}" when it has none).
    static func overrides(_ text: String, task: String) throws -> JSONObject {
        if text == "{}" { return [:] }
        guard let object = try JSON.parse(text, maxDepth: 64).objectValue else {
            throw StoreError.corrupt("task \(task) has the configuration \(text)")
        }
        return object
    }

    static func requestColumn(_ request: RequestSpec) -> String { request.json(redacted: false).serialized() }

    static func insert(_ db: Connection, _ task: TaskRecord) throws {
        try db.run(
            """
            INSERT INTO tasks (id, session_id, kind, state, waiting_reason, file_path, file_size, file_mtime_ns, request,
                upload, host_key, priority, description, idempotency_key, delete_file_on_success, configuration, attempts,
                bytes_sent, created_at, started_at, finished_at, next_attempt_at, earliest_begin_at, deadline_at, download,
                error, cancellation)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            [task.id, task.sessionID, task.kind.rawValue, task.state.rawValue, task.waitingReason?.rawValue,
             task.file.path, task.file.size, task.file.modifiedAtNanoseconds, requestColumn(task.request),
             task.upload.storedJSON.serialized(), task.request.hostKey, task.priority, task.description, task.idempotencyKey,
             task.deleteFileOnSuccess, JSON.object(task.configurationOverrides).serialized(), task.attempts,
             task.bytesSent, task.createdAt, task.startedAt, task.finishedAt, task.nextAttemptAt, task.earliestBeginAt,
             task.deadlineAt, task.download.map { $0.json.serialized() }, task.error.map { TaskRecord.errorJSON($0).serialized() },
             task.cancellation?.rawValue])
    }

    static func update(_ db: Connection, _ task: TaskRecord) throws {
        try db.run(
            """
            UPDATE tasks SET state = ?, waiting_reason = ?, request = ?, host_key = ?, priority = ?, configuration = ?,
                attempts = ?, bytes_sent = ?, started_at = ?, finished_at = ?, next_attempt_at = ?, earliest_begin_at = ?,
                deadline_at = ?, response = ?, error = ?, cancellation = ?, last_error = ?
            WHERE id = ?
            """,
            [task.state.rawValue, task.waitingReason?.rawValue, requestColumn(task.request), task.request.hostKey,
             task.priority, JSON.object(task.configurationOverrides).serialized(), task.attempts, task.bytesSent,
             task.startedAt, task.finishedAt, task.nextAttemptAt, task.earliestBeginAt, task.deadlineAt,
             task.response?.json.serialized(), task.error.map { TaskRecord.errorJSON($0).serialized() },
             task.cancellation?.rawValue, task.lastError?.json.serialized(), task.id])
    }

    static func fetchTask(_ db: Connection, id: String) throws -> TaskRecord? {
        try db.queryFirst("SELECT \(taskColumns) FROM tasks WHERE id = ?", [id], decodeTask)
    }

    /// Reads, changes and writes one task, then records the events its new state calls for.
    /// `change` throws to refuse; returns the task as written.
    static func mutate(_ db: Connection, id: String, now: Timestamp, _ change: (inout TaskRecord) throws -> Void)
        throws -> TaskRecord
    {
        guard let task = try fetchTask(db, id: id) else { throw StoreError.notFound }
        return try save(db, changing: task, now: now, change)
    }

    /// Changes a task the caller has already read (and checked) in this transaction, writes it
    /// and records its events.
    static func save(_ db: Connection, changing before: TaskRecord, now: Timestamp,
                     _ change: (inout TaskRecord) throws -> Void) throws -> TaskRecord {
        var task = before
        try change(&task)
        guard task != before else { return task }
        try update(db, task)
        try recordTransition(db, from: before, to: task, now: now)
        return task
    }

    /// Events for a state change (SPEC §2.4), in the caller's transaction.
    static func recordTransition(_ db: Connection, from before: TaskRecord?, to task: TaskRecord, now: Timestamp) throws {
        let changed = before?.state != task.state || before?.waitingReason != task.waitingReason
        guard changed else { return }
        if let type = EventType.forTaskState(task.state) {
            try appendEvent(db, type: type.rawValue, sessionID: task.sessionID, task: task, data: task.json(), now: now)
        }
        if task.state == .cancelled, before?.state.isFinal != true {
            try scheduleCleanup(db, for: task, now: now)
        }
        if task.state.isFinal, before?.state.isFinal != true {
            try sessionTaskReachedFinalState(db, sessionID: task.sessionID, now: now)
        }
    }

    /// A cancelled task whose protocol may have left something at the server (a tus upload, an
    /// S3 multipart upload) gets what releases it, queued in the same transaction: a crash after
    /// the cancel still releases it after the restart.
    static func scheduleCleanup(_ db: Connection, for task: TaskRecord, now: Timestamp) throws {
        guard task.attempts > 0 || task.checkpoint != nil else { return }
        let defaults = try fetchSession(db, id: task.sessionID)?.configuration.defaultHeaders ?? []
        let machine = UploadProtocols.machine(for: task, headers: HeaderRules.merged(defaults, task.request.headers))
        guard let plan = machine.cancellation else { return }
        try insertCleanup(db, taskID: task.id, plan, now: now)
    }

    static func insertCleanup(_ db: Connection, taskID: String, _ plan: CleanupPlan, now: Timestamp) throws {
        try db.run("INSERT INTO cleanups (task_id, request, next_attempt_at, created_at) VALUES (?, ?, ?, ?)",
                   [taskID, plan.json.serialized(), now, now])
    }

    // MARK: Client operations

    /// Inserts tasks all-or-nothing; a task whose idempotency key exists returns the first task.
    /// Each result says whether it was created.
    /// At most `maxOpen` unfinished tasks may be in the session afterwards (else
    /// `StoreError.tooManyTasks`), counted inside the transaction, so concurrent creates cannot
    /// pass the limit together.
    public func createTasks(sessionID: String, _ tasks: [TaskRecord], maxOpen: Int = .max) throws(StoreError) -> [(TaskRecord, Bool)] {
        let now = self.now
        return try write { db in
            guard let session = try Store.fetchSession(db, id: sessionID) else { throw StoreError.notFound }
            guard session.lifecycle == .active else {
                throw StoreError.conflict("the session is finishing and accepts no new tasks")
            }
            if maxOpen < .max {
                let open = try Store.openTaskCount(db, sessionID: sessionID)
                if open + tasks.count > maxOpen { throw StoreError.tooManyTasks(open: open, limit: maxOpen) }
            }
            var results: [(TaskRecord, Bool)] = []
            var keysInBatch: [String: TaskRecord] = [:]
            let quota = session.configuration.quotaBytes
            var held: Int64 = 0
            if quota != nil {
                held = try db.queryFirst(
                    "SELECT COALESCE(SUM(file_size), 0) FROM tasks WHERE session_id = ? AND state IN \(Store.unfinishedStates)",
                    [sessionID]) { $0.int(0) } ?? 0
            }
            for var task in tasks {
                if let key = task.idempotencyKey {
                    if let existing = keysInBatch[key] {
                        results.append((existing, false))
                        continue
                    }
                    if let existing = try db.queryFirst(
                        "SELECT \(Store.taskColumns) FROM tasks WHERE session_id = ? AND idempotency_key = ? AND detached_from IS NULL",
                        [sessionID, key], Store.decodeTask)
                    {
                        results.append((existing, false))
                        continue
                    }
                }
                if let quota, held + task.file.size > quota {
                    // The session's quota cannot keep it: it ends at once, and says why.
                    Store.cancel(&task, reason: .insufficientSystemResources, now: now,
                                 message: "cancelled: the session's quota_bytes (\(quota)) cannot hold \(task.file.size) more bytes")
                } else if !session.enabled {
                    task.state = .waiting
                    task.waitingReason = .sessionDisabled
                } else if let begin = task.earliestBeginAt, begin > now {
                    task.state = .waiting
                    task.waitingReason = .scheduled
                }
                if !task.state.isFinal { held += task.file.size }
                try Store.insert(db, task)
                task.sequence = db.lastInsertRowID
                if let key = task.idempotencyKey { keysInBatch[key] = task }
                try Store.recordTransition(db, from: nil, to: task, now: now)
                results.append((task, true))
            }
            return results
        }
    }

    public func task(id: String) throws(StoreError) -> TaskRecord? {
        try read { db in try Store.fetchTask(db, id: id) }
    }

    /// A session's tasks in creation order, after `cursor`, optionally of one state.
    public func tasks(sessionID: String, state: TaskState?, cursor: String?, limit: Int) throws(StoreError) -> TaskPage {
        let after = cursor.flatMap { Int64($0) } ?? 0
        return try read { db in
            var rows: [TaskRecord]
            if let state {
                rows = try db.query(
                    "SELECT \(Store.taskColumns) FROM tasks WHERE session_id = ? AND state = ? AND seq > ? ORDER BY seq LIMIT ?",
                    [sessionID, state.rawValue, after, limit + 1], Store.decodeTask)
            } else {
                rows = try db.query(
                    "SELECT \(Store.taskColumns) FROM tasks WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    [sessionID, after, limit + 1], Store.decodeTask)
            }
            var next: String?
            if rows.count > limit {
                rows.removeLast()
                next = rows.last.map { String($0.sequence) }
            }
            return TaskPage(tasks: rows, nextCursor: next)
        }
    }

    /// Applies a client change to an unfinished task (PATCH). `change` may throw a ValidationError.
    public func updateTask(id: String, _ change: @Sendable (inout TaskRecord) throws -> Void) throws -> TaskRecord {
        let now = self.now
        return try write { db in
            try Store.mutate(db, id: id, now: now) { task in
                guard !task.state.isFinal else { throw StoreError.conflict("the task is \(task.state.rawValue)") }
                try change(&task)
                // New credentials release a task held for authentication.
                if task.state == .authRequired { task.state = .queued; task.waitingReason = nil }
                if task.state == .waiting, task.waitingReason == .scheduled, (task.earliestBeginAt ?? 0) <= now {
                    task.state = .queued
                    task.waitingReason = nil
                } else if task.state == .queued, let begin = task.earliestBeginAt, begin > now {
                    task.state = .waiting
                    task.waitingReason = .scheduled
                }
            }
        }
    }

    /// cancel / suspend / resume (SPEC §2.2); a refused transition is a conflict.
    public func apply(_ command: TaskCommand, to id: String,
                      reason: CancellationReason = .userCancelled) throws(StoreError) -> TaskRecord {
        let now = self.now
        return try write { db in
            try Store.mutate(db, id: id, now: now) { task in
                switch task.state.applying(command) {
                case .failure(let refused):
                    throw StoreError.conflict("cannot \(refused.command.rawValue) a task that is \(refused.state.rawValue)")
                case .success(let next):
                    if next == .cancelled {
                        Store.cancel(&task, reason: reason, now: now)
                    } else {
                        Store.enter(next, task: &task, now: now)
                    }
                }
            }
        }
    }

    /// Deletes a finished task's record.
    public func deleteTask(id: String) throws(StoreError) {
        try write { db in
            guard let task = try Store.fetchTask(db, id: id) else { throw StoreError.notFound }
            guard task.state.isFinal else {
                throw StoreError.conflict("only finished tasks can be deleted; cancel it first")
            }
            try db.run("DELETE FROM tasks WHERE id = ?", [id])
        }
    }

    /// Ends a task as cancelled, saying why (SPEC §2.3); the message defaults to the reason's name.
    static func cancel(_ task: inout TaskRecord, reason: CancellationReason, now: Timestamp, message: String? = nil) {
        enter(.cancelled, task: &task, now: now)
        task.cancellation = reason
        task.error = TaskError(.cancelled, message: message ?? "cancelled: \(reason.name)")
    }

    /// Sets the state and the fields that go with it.
    static func enter(_ state: TaskState, task: inout TaskRecord, now: Timestamp, waitingReason: WaitingReason? = nil) {
        task.state = state
        task.waitingReason = state == .waiting ? waitingReason : nil
        if state != .retrying { task.nextAttemptAt = nil }
        if state.isFinal { task.finishedAt = now }
    }

    // MARK: Engine operations

    /// Tasks that were running when the daemon stopped go back to the queue (their attempt counted).
    public func recoverInterrupted() throws(StoreError) -> Int {
        try write { db in try db.run("UPDATE tasks SET state = 'queued' WHERE state = 'running'") }
    }

    /// Queued tasks in run order (priority, then creation), leaving out the (session, host) keys
    /// in `excluding` (`"<session> <scheme://host:port>"`, those at their connection limit): only
    /// what the scheduler needs to pick. SQLite skips the excluded rows itself, so a deep queue
    /// for one busy host costs little.
    public func queuedTasks(excluding keys: Set<String> = [], limit: Int) throws(StoreError) -> [QueueEntry] {
        try read { db in
            let excluded = JSON.array(keys.sorted().map { .string($0) }).serialized()
            return try db.query(
                """
                SELECT \(Store.queueColumns) FROM tasks
                WHERE state = 'queued' AND session_id || ' ' || host_key NOT IN (SELECT value FROM json_each(?))
                ORDER BY priority DESC, seq LIMIT ?
                """, [excluded, limit], Store.decodeQueueEntry)
        }
    }

    /// The columns `decodeQueueEntry` reads.
    static let queueColumns = "seq, id, session_id, host_key, priority, configuration"

    static func decodeQueueEntry(_ row: Row) throws -> QueueEntry {
        QueueEntry(
            sequence: row.int(0), id: row.string(1), sessionID: row.string(2), hostKey: row.string(3), priority: row.double(4),
            configurationOverrides: try overrides(row.string(5), task: row.string(1)))
    }

    /// Tasks shown running that are not in `running` (the engine's) go back to the queue, their
    /// attempt not counted. Returns how many.
    public func requeueRunning(except running: Set<String>) throws(StoreError) -> Int {
        let now = self.now
        return try write(.relaxed) { db in
            let excluded = JSON.array(running.sorted().map { .string($0) }).serialized()
            let ids = try db.query(
                "SELECT id FROM tasks WHERE state = 'running' AND id NOT IN (SELECT value FROM json_each(?))", [excluded]) {
                $0.string(0)
            }
            for id in ids {
                _ = try Store.mutate(db, id: id, now: now) { task in
                    Store.enter(.queued, task: &task, now: now)
                    task.attempts -= 1
                }
            }
            return ids.count
        }
    }

    /// Marks a queued task running and counts the attempt; nil if it is no longer queued.
    public func startAttempt(id: String) throws(StoreError) -> TaskRecord? {
        let now = self.now
        return try write(.relaxed) { db in
            guard let queued = try Store.fetchTask(db, id: id), queued.state == .queued else { return nil }
            return try Store.save(db, changing: queued, now: now) { task in
                Store.enter(.running, task: &task, now: now)
                task.attempts += 1
                if task.startedAt == nil { task.startedAt = now }
            }
        }
    }

    /// Records how attempt `attempt` ended, unless the task left that attempt meanwhile
    /// (cancelled, suspended, expired): then nothing is written and nil is returned.
    @discardableResult
    public func finishAttempt(id: String, attempt: Int, bytesSent: Int64, result: AttemptResult,
                              record: AttemptRecord? = nil) throws(StoreError) -> TaskRecord? {
        let now = self.now
        return try write(.relaxed) { db in
            guard let current = try Store.fetchTask(db, id: id), current.state == .running, current.attempts == attempt else {
                return nil
            }
            if var record {
                record.outcome = result.outcome
                if let error = result.attemptError { record.error = error }
                try Store.appendAttempt(db, taskSequence: current.sequence, record)
            }
            return try Store.save(db, changing: current, now: now) { task in
                if let error = result.attemptError { task.lastError = LastError(error, at: now) }
                task.bytesSent = bytesSent
                switch result {
                case .completed(let response):
                    Store.enter(.completed, task: &task, now: now)
                    task.response = response
                    task.bytesSent = task.file.size
                case .failed(let error, let response):
                    Store.enter(.failed, task: &task, now: now)
                    task.error = error
                    if let response { task.response = response }
                case .retry(let at, _, let response):
                    Store.enter(.retrying, task: &task, now: now)
                    task.nextAttemptAt = at
                    if let response { task.response = response }
                case .authenticationRequired(let response):
                    Store.enter(.authRequired, task: &task, now: now)
                    if let response { task.response = response }
                case .interrupted:
                    Store.enter(.queued, task: &task, now: now)
                    task.attempts -= 1
                case .held(let reason):
                    Store.enter(.waiting, task: &task, now: now, waitingReason: reason)
                    task.attempts -= 1
                case .cancelled(let reason, let message):
                    Store.cancel(&task, reason: reason, now: now, message: message)
                case .invalidConfiguration(let error):
                    Store.enter(.failed, task: &task, now: now)
                    task.error = error
                }
            }
        }
    }

    /// Appends an attempt to a task's history (numbered after the last one) and drops what falls
    /// beyond `AttemptRecord.historyLimit`.
    static func appendAttempt(_ db: Connection, taskSequence: Int64, _ record: AttemptRecord) throws {
        let number = (try db.queryFirst("SELECT COALESCE(MAX(number), 0) FROM attempts WHERE task_seq = ?", [taskSequence]) {
            $0.int(0)
        } ?? 0) + 1
        try db.run(
            """
            INSERT INTO attempts (task_seq, number, started_at, ended_at, bytes_sent, bytes_received, outcome, http_status, error,
                network_type) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            [taskSequence, number, record.startedAt, record.endedAt, record.bytesSent, record.bytesReceived, record.outcome.rawValue,
             record.httpStatus ?? record.error?.httpStatus, record.error.map { TaskRecord.errorJSON($0).serialized() },
             record.networkType?.rawValue])
        if number > Int64(AttemptRecord.historyLimit) {
            try db.run("DELETE FROM attempts WHERE task_seq = ? AND number <= ?", [taskSequence, number - Int64(AttemptRecord.historyLimit)])
        }
    }

    /// Records an attempt the engine stopped after the task left it (a client's cancel or
    /// suspend, a session disabled, the resource timeout): the task's state is not touched.
    public func recordStoppedAttempt(id: String, _ record: AttemptRecord) throws(StoreError) {
        try write(.relaxed) { db in
            guard let sequence = try db.queryFirst("SELECT seq FROM tasks WHERE id = ?", [id], { $0.int(0) }) else { return }
            var stopped = record
            stopped.outcome = .stopped
            try Store.appendAttempt(db, taskSequence: sequence, stopped)
        }
    }

    /// A task's attempts, newest first (at most `AttemptRecord.historyLimit`); nil when there is
    /// no such task.
    public func attempts(taskID: String) throws(StoreError) -> [AttemptRecord]? {
        try read { db in
            guard let sequence = try db.queryFirst("SELECT seq FROM tasks WHERE id = ?", [taskID], { $0.int(0) }) else { return nil }
            return try db.query(
                """
                SELECT number, started_at, ended_at, bytes_sent, bytes_received, outcome, http_status, error, network_type
                FROM attempts WHERE task_seq = ? ORDER BY number DESC
                """, [sequence]) { row -> AttemptRecord in
                guard let outcome = AttemptRecord.Outcome(rawValue: row.string(5)) else {
                    throw StoreError.corrupt("attempt \(row.int(0)) of task \(taskID) has the outcome \(row.string(5))")
                }
                return AttemptRecord(
                    number: Int(row.int(0)), startedAt: row.double(1), endedAt: row.double(2), bytesSent: row.int(3),
                    bytesReceived: row.int(4), outcome: outcome, httpStatus: row.optionalInt(6).map { Int($0) },
                    error: try row.optionalString(7).flatMap { TaskRecord.decodeError(try JSON.parse($0, maxDepth: 16)) },
                    networkType: row.optionalString(8).flatMap(NetworkType.init(rawValue:)))
            }
        }
    }

    /// Persists what the server acknowledged of a resumable upload, if the task is still in
    /// that attempt.
    public func saveCheckpoint(id: String, attempt: Int, _ checkpoint: UploadCheckpoint) throws(StoreError) {
        try write(.relaxed) { db in
            try db.run(
                "UPDATE tasks SET checkpoint = ?, bytes_sent = ? WHERE id = ? AND state = 'running' AND attempts = ?",
                [checkpoint.json.serialized(), checkpoint.offset, id, attempt])
        }
    }

    /// Persists a running attempt's progress and records a `task.progress` event (the engine
    /// calls this at a bounded rate).
    public func recordProgress(id: String, attempt: Int, bytesSent: Int64, live: LiveProgress) throws(StoreError) {
        let now = self.now
        try write(.relaxed) { db in
            guard var task = try Store.fetchTask(db, id: id), task.state == .running, task.attempts == attempt else { return }
            task.bytesSent = bytesSent
            try db.run("UPDATE tasks SET bytes_sent = ? WHERE id = ?", [bytesSent, id])
            try Store.appendEvent(db, type: EventType.taskProgress.rawValue, sessionID: task.sessionID, task: task,
                                  data: task.json(live: live), now: now)
        }
    }

    /// Moves tasks whose timers have passed: retries due → queued, scheduled starts due → queued,
    /// resource deadlines passed → failed -1001. Returns the ids that failed.
    public func fireTimers(now: Timestamp) throws(StoreError) -> [String] {
        try write(.relaxed) { db in
            let due = try db.query(
                "SELECT id FROM tasks WHERE state = 'retrying' AND next_attempt_at <= ?", [now]) { $0.string(0) }
            for id in due {
                _ = try Store.mutate(db, id: id, now: now) { Store.enter(.queued, task: &$0, now: now) }
            }
            let scheduled = try db.query(
                "SELECT id FROM tasks WHERE state = 'waiting' AND waiting_reason = 'scheduled' AND earliest_begin_at <= ?",
                [now]) { $0.string(0) }
            for id in scheduled {
                _ = try Store.mutate(db, id: id, now: now) { Store.enter(.queued, task: &$0, now: now) }
            }
            let expired = try db.query(
                "SELECT id FROM tasks WHERE deadline_at <= ? AND state NOT IN ('completed', 'failed', 'cancelled')",
                [now]) { $0.string(0) }
            for id in expired {
                _ = try Store.mutate(db, id: id, now: now) { task in
                    let wasAuth = task.state == .authRequired
                    Store.enter(.failed, task: &task, now: now)
                    task.error = wasAuth
                        ? TaskError(.userAuthenticationRequired, message: "the server asked for authentication and no new credentials came before the resource timeout", httpStatus: 401)
                        : TaskError(.timedOut, message: "the resource timeout was reached")
                }
            }
            return expired
        }
    }

    /// The earliest moment a timer of `fireTimers` is due, if any.
    public func nextTimer() throws(StoreError) -> Timestamp? {
        try read { db in
            let retry = try db.queryFirst("SELECT MIN(next_attempt_at) FROM tasks WHERE state = 'retrying'") { $0.optionalDouble(0) } ?? nil
            let scheduled = try db.queryFirst(
                "SELECT MIN(earliest_begin_at) FROM tasks WHERE state = 'waiting' AND waiting_reason = 'scheduled'") {
                    $0.optionalDouble(0)
                } ?? nil
            let deadline = try db.queryFirst(
                "SELECT MIN(deadline_at) FROM tasks WHERE state NOT IN ('completed', 'failed', 'cancelled')") {
                    $0.optionalDouble(0)
                } ?? nil
            return [retry, scheduled, deadline].compactMap { $0 }.min()
        }
    }

    /// The states of the given tasks (the engine checks its running transfers against them).
    public func states(of ids: [String]) throws(StoreError) -> [String: TaskState] {
        try read { db in
            var result: [String: TaskState] = [:]
            for id in ids {
                if let state = try db.queryFirst("SELECT state FROM tasks WHERE id = ?", [id], { $0.string(0) }) {
                    result[id] = TaskState(rawValue: state)
                }
            }
            return result
        }
    }

    /// Counts of waiting tasks by reason (metrics).
    public func waitingCounts() throws(StoreError) -> [WaitingReason: Int] {
        try read { db in
            var counts: [WaitingReason: Int] = [:]
            for (reason, count) in try db.query(
                "SELECT waiting_reason, COUNT(*) FROM tasks WHERE state = 'waiting' GROUP BY waiting_reason", [],
                { ($0.optionalString(0) ?? "", Int($0.int(1))) })
            {
                if let reason = WaitingReason(rawValue: reason) { counts[reason] = count }
            }
            return counts
        }
    }

    /// Counts of tasks by state, over all sessions (metrics, info).
    public func taskCounts() throws(StoreError) -> [TaskState: Int] {
        try read { db in
            var counts: [TaskState: Int] = [:]
            for (state, count) in try db.query("SELECT state, COUNT(*) FROM tasks GROUP BY state", [], { ($0.string(0), Int($0.int(1))) }) {
                if let state = TaskState(rawValue: state) { counts[state] = count }
            }
            return counts
        }
    }
}
