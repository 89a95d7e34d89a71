import BackhaulCore
import BackhaulFiles
import BackhaulQueue
import JSONCodec
import Logging
import MicroHTTP

/// Tasks (OpenAPI/backhaul.yaml): create (one or a batch), list, read, change, command, delete, attempts.
extension API {
    @Sendable func createTasks(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = try sessionID(request)
        guard let session = try stored({ () throws(StoreError) in try store.sessionRecord(id: id) }) else {
            throw Problem(.notFound, "no session \(id)")
        }
        if let settings, !settings.policy.transfersEnabled {
            throw Problem(.transfersDisabled, "the service policy has transfers_enabled false; PUT /v1/policy to turn them on")
        }
        let value = try body(request)
        let isBatch = value["tasks"] != nil
        var items: [(JSON, String)]
        if isBatch {
            guard value.objectValue?.count == 1, let array = value["tasks"]?.arrayValue else {
                throw Problem(.validationFailed, "a batch is {\"tasks\": [...]} and nothing else", extra: ["field": "tasks"])
            }
            guard !array.isEmpty, array.count <= options.maxTasksPerBatch else {
                throw Problem(
                    .validationFailed, "a batch holds 1 to \(options.maxTasksPerBatch) tasks", extra: ["field": "tasks"])
            }
            items = array.enumerated().map { ($0.element, "tasks[\($0.offset)]") }
        } else {
            items = [(value, "")]
        }
        let now = clock.now()
        guard isBatch else {
            // Rendered here as created waiting, when it will be, as a batch's tasks are: the writer
            // writes this text as the event, and when it did, it is the answer too.
            var directories = ResolvedDirectories()
            var ids = RandomID.Series(prefix: "tsk_", at: now)
            let record = try makeTask(
                items[0].0, path: items[0].1, session: session, now: now, ids: &ids, directories: &directories)
            let waitingJSON =
                session.enabled ? nil : [record.admitted(sessionEnabled: false, quotaRefusal: nil, now: now).jsonText()]
            let batch = TaskBatch([record], waitingJSON: waitingJSON)
            let results = try stored { () throws(StoreError) in
                try store.createTasks(sessionID: id, batch, maxOpen: options.maxOpenTasksPerSession).wait()
            }
            if let json = batch.inserted(part: 0)?.first?.json { return API.json(201, text: json) }
            return taskResponse(results[0].1 ? 201 : 200, results[0].0)
        }
        return try createBatch(sessionID: id, items, session: session, now: now)
    }

    /// Tasks validated per part of a batch: the store inserts one part while the next is checked.
    static let batchPart = 100

    /// A batch in one transaction, all-or-nothing, in three overlapping steps: the tasks are
    /// validated a part at a time and each part handed to the store, which inserts it while the
    /// next is checked (`TaskBatch`); the answer is written part by part as they go in; it is sent
    /// once the batch is on disk. A task that fails validation abandons the batch: nothing of it
    /// is written. When the store had to run the insert again (another write of the same
    /// transaction failed), the answer is written again from what committed.
    func createBatch(sessionID id: String, _ items: [(JSON, String)], session: SessionRecord, now: Timestamp) throws(Problem)
        -> HTTPResponse
    {
        let batch = TaskBatch(count: items.count)
        let pending = store.createTasks(sessionID: id, batch, maxOpen: options.maxOpenTasksPerSession)
        // Into a disabled session a task is created waiting, with a `task.waiting` event whose data
        // is the task's JSON: rendered here once, as the task will be, for the writer's event and,
        // when the writer wrote it, for this answer (the writer has the batch's work to do, and the
        // check has time to spare).
        let renderWaiting = !session.enabled
        var part: [TaskRecord] = []
        var waitingJSON: [String] = []
        var directories = ResolvedDirectories()
        var ids = RandomID.Series(prefix: "tsk_", at: now)
        part.reserveCapacity(API.batchPart)
        do {
            for (offset, (item, path)) in items.enumerated() {
                let task = try makeTask(item, path: path, session: session, now: now, ids: &ids, directories: &directories)
                part.append(task)
                if renderWaiting {
                    waitingJSON.append(task.admitted(sessionEnabled: false, quotaRefusal: nil, now: now).jsonText())
                }
                guard part.count == API.batchPart || offset == items.count - 1 else { continue }
                batch.add(part, waitingJSON: renderWaiting ? waitingJSON : nil)
                part.removeAll(keepingCapacity: true)
                waitingJSON.removeAll(keepingCapacity: true)
            }
        } catch {
            batch.abandon()
            // Its rollback first: the client's next request finds the store as it was.
            _ = try? pending.wait()
            throw error
        }
        batch.close()
        var answer = JSONWriter(capacity: 1024 * items.count)
        answer.object { object in
            object.key("tasks")
            object.array { array in
                for index in 0..<(items.count + API.batchPart - 1) / API.batchPart {
                    guard let results = batch.inserted(part: index) else { break }
                    for (task, _, json) in results {
                        if let json { array.raw(json) } else { writeTask(task, to: &array) }
                    }
                }
            }
        }
        let results = try stored { () throws(StoreError) in try pending.wait() }
        if case .timedOut(let seconds)? = batch.stopped {
            throw Problem(
                .unavailable,
                "the batch's tasks took over \(Int(seconds)) s to check (a file system that hangs?); nothing was written")
        }
        let status = results.contains { $0.1 } ? 201 : 200
        // Runs only go up: when the insert that committed was the first, every part written came from it.
        guard batch.run == 1 else { return tasksResponse(status, results.map(\.0)) }
        return API.json(status, answer)
    }

    /// `ids`: the request's series of task ids (a batch's sort in its order); `directories`: those
    /// the request's files were found in so far.
    func makeTask(
        _ value: JSON, path: String, session: SessionRecord, now: Timestamp, ids: inout RandomID.Series,
        directories: inout ResolvedDirectories
    ) throws(Problem) -> TaskRecord {
        let draft: TaskDraft
        let configuration: TransferConfiguration
        do {
            draft = try TaskDraft.decode(value, path: path, base: session.configuration)
            configuration = try session.configuration.applying(.object(draft.configurationOverrides))
        } catch {
            throw API.problem(error)
        }
        if let refusal = options.destinations.refusal(draft.request.url, for: .upload) {
            let field = path.isEmpty ? "request.url" : "\(path).request.url"
            throw Problem(.destinationNotAllowed, "\(field): \(refusal)", extra: ["field": .string(field)])
        }
        let file: FileInfo
        var download = draft.download
        let inspected =
            download.map { spec in
                options.allowedRoots.inspectDestination(spec.destination, overwrite: spec.overwrite).map {
                    FileInfo(path: $0, size: 0, modifiedAtNanoseconds: 0)
                }
            } ?? options.allowedRoots.inspect(draft.filePath, directories: &directories)
        switch inspected {
        case .success(let info): file = info
        case .failure(let error):
            let kind = Problem.Kind(rawValue: error.code) ?? .validationFailed
            let name = download == nil ? "file" : "destination"
            let field = path.isEmpty ? name : "\(path).\(name)"
            throw Problem(kind, "\(field): \(error.message): \(draft.filePath)", extra: ["field": .string(field)])
        }
        download?.destination = file.path
        var task = TaskRecord(
            id: ids.next(), sessionID: session.id, file: file, request: draft.request,
            upload: draft.upload,
            createdAt: now, deadlineAt: now + configuration.timeoutIntervalForResource)
        task.kind = draft.kind
        task.download = download
        task.priority = draft.priority
        task.description = draft.description
        task.idempotencyKey = draft.idempotencyKey
        task.deleteFileOnSuccess = draft.deleteFileOnSuccess
        task.configurationOverrides = draft.configurationOverrides
        task.earliestBeginAt = draft.earliestBeginAt
        return task
    }

    @Sendable func listTasks(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = try sessionID(request)
        guard try stored({ () throws(StoreError) in try store.session(id: id) }) != nil else {
            throw Problem(.notFound, "no session \(id)")
        }
        var state: TaskState?
        if let name = request.http.query["state"] {
            guard let parsed = TaskState(rawValue: name) else {
                throw Problem(
                    .validationFailed, "state must be one of \(TaskState.allCases.map(\.rawValue).joined(separator: ", "))",
                    extra: ["field": "state"])
            }
            state = parsed
        }
        let (limit, cursor) = try page(request)
        let page = try stored { () throws(StoreError) in
            try store.tasks(sessionID: id, state: state, cursor: cursor, limit: limit)
        }
        return tasksResponse(200, page.tasks, isPage: true, nextCursor: page.nextCursor)
    }

    /// `limit` (1…1000, default 100) and `cursor` of a list request.
    func page(_ request: RouteRequest) throws(Problem) -> (limit: Int, cursor: String?) {
        var limit = 100
        if let text = request.http.query["limit"] {
            guard let parsed = Int(text), (1...1000).contains(parsed) else {
                throw Problem(.validationFailed, "limit must be an integer from 1 to 1000", extra: ["field": "limit"])
            }
            limit = parsed
        }
        let cursor = request.http.query["cursor"]
        if let cursor, !cursor.isEmpty, Int64(cursor) == nil {
            throw Problem(.validationFailed, "cursor is not one this API gave out", extra: ["field": "cursor"])
        }
        return (limit, cursor)
    }

    func existingTask(_ request: RouteRequest) throws(Problem) -> TaskRecord {
        let id = request.parameter("id")
        guard let task = try stored({ () throws(StoreError) in try store.task(id: id) }) else {
            throw Problem(.notFound, "no task \(id)")
        }
        return task
    }

    @Sendable func getTask(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        taskResponse(200, try existingTask(request))
    }

    /// `GET /v1/tasks/{id}/attempts`: the task's attempts, newest first (OpenAPI/backhaul.yaml).
    @Sendable func listAttempts(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = request.parameter("id")
        guard let attempts = try stored({ () throws(StoreError) in try store.attempts(taskID: id) }) else {
            throw Problem(.notFound, "no task \(id)")
        }
        return API.json(200, ["attempts": .array(attempts.map(\.json))])
    }

    @Sendable func patchTask(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let current = try existingTask(request)
        guard let session = try stored({ () throws(StoreError) in try store.sessionRecord(id: current.sessionID) }) else {
            throw Problem(.notFound, "the task's session is gone")
        }
        let value = try body(request)
        let updated = try validated {
            let change = try TaskPatch.decode(value, session: session.configuration)
            if let url = change.url, let refusal = options.destinations.refusal(url, for: .upload) {
                throw Problem(.destinationNotAllowed, "request.url: \(refusal)", extra: ["field": "request.url"])
            }
            return try store.updateTask(id: current.id) { task in try change.apply(to: &task, session: session.configuration) }
        }
        return taskResponse(200, updated)
    }

    @Sendable func deleteTask(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = request.parameter("id")
        try stored { () throws(StoreError) in try store.deleteTask(id: id) }
        return HTTPResponse(status: 204)
    }

    func command(_ command: TaskCommand, _ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = request.parameter("id")
        let task = try stored { () throws(StoreError) in try store.apply(command, to: id) }
        return taskResponse(200, task)
    }
}
