import BackhaulCore
import BackhaulEngine
import BackhaulStore
import JSON
import Logging
import MicroHTTP

/// What the API needs from the daemon's configuration.
public struct APIOptions: Sendable {
    public var allowedRoots: AllowedRoots
    public var maxTasksPerBatch = 10_000
    /// Unfinished tasks one session may hold (`--max-open-tasks`); more are refused with 429.
    public var maxOpenTasksPerSession = 1_000_000
    public var maxJSONDepth = 32
    /// Shown by `/v1/info` (already without secrets).
    public var info: JSONObject = [:]
    /// Bearer tokens; nil: no authentication (the daemon then listens on loopback only).
    public var tokens: AccessTokens?
    /// Where uploads and webhooks may go.
    public var destinations = DestinationRules()
    /// Serve the dashboard (`GET /`, `/ui/…`); `--no-ui` turns it off.
    public var dashboard = true

    public init(allowedRoots: AllowedRoots) { self.allowedRoots = allowedRoots }
}

/// The REST API's handlers. Each takes a request value and returns a response value; none
/// knows the transport (tests call `router` in process).
public final class API: Sendable {
    let store: Store
    let engine: Engine?
    let options: APIOptions
    let clock: any Clock
    let logger: Logger
    let eventFeed: EventFeed?
    /// What the HTTP layer measured of each request, shown by `/metrics`.
    let requestMetrics: RequestMetrics?

    public init(store: Store, engine: Engine?, eventFeed: EventFeed? = nil, requestMetrics: RequestMetrics? = nil, options: APIOptions,
                clock: any Clock = SystemClock(), logger: Logger) {
        self.store = store
        self.requestMetrics = requestMetrics
        self.engine = engine
        self.eventFeed = eventFeed
        self.options = options
        self.clock = clock
        self.logger = logger
    }

    public var router: Router {
        Router(routes: routes) { [self] (route, request) throws(Problem) in try authorize(route, request) }
    }

    /// The caller's token against the route's `Access`. Out of a client's scope, reads answer 404
    /// exactly as for a resource that does not exist (nothing leaks) and writes 403.
    func authorize(_ route: Route, _ request: RouteRequest) throws(Problem) -> Principal? {
        guard let tokens = options.tokens, route.access != .open else { return nil }
        guard let principal = tokens.principal(authorization: request.http.header("authorization")) else {
            throw Problem(.unauthorized, "a valid bearer token is required (Authorization: Bearer …)")
        }
        let reading = request.http.method == "GET" || request.http.method == "HEAD"
        func scoped(_ session: String?, _ notFound: String) throws(Problem) {
            guard let session, !principal.canAccess(session: session) else { return }
            throw reading ? Problem(.notFound, notFound) : Problem(.forbidden, "this token is not allowed to change that")
        }
        let id = request.parameter("id")
        switch route.access {
        case .open, .authenticated:
            break
        case .admin:
            guard principal == .admin else { throw Problem(.forbidden, "this needs an admin token") }
        case .session:
            try scoped(id, "no session \(id)")
        case .task:
            try scoped(try stored { () throws(StoreError) in try store.task(id: id) }?.sessionID, "no task \(id)")
        case .webhook:
            try scoped(try stored { () throws(StoreError) in try store.webhook(id: id) }?.sessionID, "no webhook \(id)")
        }
        return principal
    }

    // MARK: Helpers

    static func json(_ status: Int, _ value: JSON) -> HTTPResponse {
        HTTPResponse(status: status, headers: [("Content-Type", "application/json")], body: value.serializedBytes())
    }

    func body(_ request: RouteRequest) throws(Problem) -> JSON {
        guard !request.http.body.isEmpty else { throw Problem(.invalidJSON, "the request needs a JSON body") }
        do {
            return try JSON.parse(request.http.body, maxDepth: options.maxJSONDepth)
        } catch {
            throw Problem(.invalidJSON, "the body is not valid JSON: \(error.description)")
        }
    }

    static func problem(_ error: StoreError) -> Problem {
        switch error {
        case .notFound: return Problem(.notFound, "no such resource")
        case .sessionExists: return Problem(.sessionExists, "the session exists with a different configuration; use PATCH to change it")
        case .conflict(let message): return Problem(.conflict, message)
        case .storageFull: return Problem(.insufficientStorage, "the state directory is full; nothing was changed")
        case .invalid(let error): return problem(error)
        case .database(let message): return Problem(.internalError, "the state database failed: \(message)")
        }
    }

    static func problem(_ error: ValidationError) -> Problem {
        Problem(.validationFailed, error.description, extra: ["field": .string(error.field)])
    }

    /// Runs validation and store work, mapping each kind of error to its problem.
    func validated<T>(_ body: () throws -> T) throws(Problem) -> T {
        do {
            return try body()
        } catch let error as ValidationError {
            throw API.problem(error)
        } catch let error as StoreError {
            throw API.problem(error)
        } catch let error as Problem {
            throw error
        } catch {
            throw Problem(.internalError, "\(error)")
        }
    }

    /// Runs a store call, mapping its errors to problems.
    func stored<T>(_ body: () throws(StoreError) -> T) throws(Problem) -> T {
        do { return try body() } catch { throw API.problem(error) }
    }

    func sessionID(_ request: RouteRequest) throws(Problem) -> String {
        let id = request.parameter("id")
        guard SessionRecord.isValidID(id) else {
            throw Problem(.validationFailed, "a session id is 1 to 128 of A-Z a-z 0-9 . _ -", extra: ["field": "id"])
        }
        return id
    }

    func taskJSON(_ task: TaskRecord) -> JSON {
        var live: LiveProgress?
        if task.state == .running { live = engine?.liveProgress(taskID: task.id) }
        var value = task.json(live: live)
        if task.state == .queued, engine?.isHostSaturated(sessionID: task.sessionID, hostKey: task.request.hostKey) == true,
            case .object(var object) = value
        {
            object["waiting_reason"] = .string(WaitingReason.hostConnectionLimit.rawValue)
            value = .object(object)
        }
        return value
    }

    // MARK: Operations

    @Sendable func health(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        API.json(200, ["status": "ok"])
    }

    @Sendable func ready(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        guard store.isWritable() else { throw Problem(.unavailable, "the state database cannot be written") }
        guard engine?.isRunning ?? false else { throw Problem(.unavailable, "the transfer engine is not running") }
        return API.json(200, ["status": "ready"])
    }

    @Sendable func info(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        var object = options.info
        object["version"] = .string(BackhaulVersion.string)
        object["protocols"] = .array(UploadProtocol.allCases.filter { UploadProtocol.supported.contains($0) }.map { .string($0.rawValue) })
        let counts = try stored { () throws(StoreError) in try store.taskCounts() }
        var tasks = JSONObject()
        for state in TaskState.allCases { tasks[state.rawValue] = .int(Int64(counts[state] ?? 0)) }
        object["task_counts"] = .object(tasks)
        return API.json(200, .object(object))
    }

    // MARK: Sessions

    @Sendable func listSessions(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let sessions = try stored { () throws(StoreError) in try store.sessions() }
            .filter { request.principal?.canAccess(session: $0.0.id) ?? true }
        return API.json(200, ["sessions": .array(sessions.map { $0.0.json(taskCounts: $0.1) })])
    }

    @Sendable func putSession(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = try sessionID(request)
        let value = try body(request)
        let configuration = try validated {
            let reader = try FieldReader(value)
            try reader.rejectUnknown(["configuration"])
            return try TransferConfiguration().applying(reader.value("configuration") ?? .object([:]))
        }
        let (session, created) = try stored { () throws(StoreError) in try store.putSession(id: id, configuration: configuration) }
        let counts = try stored { () throws(StoreError) in try store.session(id: id)?.1 ?? [:] }
        return API.json(created ? 201 : 200, session.json(taskCounts: counts))
    }

    @Sendable func getSession(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = try sessionID(request)
        guard let (session, counts) = try stored({ () throws(StoreError) in try store.session(id: id) }) else {
            throw Problem(.notFound, "no session \(id)")
        }
        return API.json(200, session.json(taskCounts: counts))
    }

    @Sendable func patchSession(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = try sessionID(request)
        guard let (current, _) = try stored({ () throws(StoreError) in try store.session(id: id) }) else {
            throw Problem(.notFound, "no session \(id)")
        }
        let value = try body(request)
        let (configuration, enabled, cancelPending) = try validated {
            let reader = try FieldReader(value)
            try reader.rejectUnknown(["configuration", "enabled", "cancel_pending"])
            let configuration = try reader.value("configuration").map { try current.configuration.applying($0) }
            let enabled = try reader.bool("enabled")
            let cancelPending = try reader.bool("cancel_pending") ?? false
            if cancelPending, enabled != false {
                throw ValidationError("cancel_pending", "goes with \"enabled\": false")
            }
            return (configuration, enabled, cancelPending)
        }
        let (session, counts) = try stored { () throws(StoreError) in
            try store.updateSession(id: id, configuration: configuration, enabled: enabled, cancelPending: cancelPending)
        }
        engine?.wake(policy: configuration != nil)
        return API.json(200, session.json(taskCounts: counts))
    }

    @Sendable func deleteSession(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = try sessionID(request)
        let mode = request.http.query["mode"] ?? "finish"
        guard mode == "finish" || mode == "cancel" else {
            throw Problem(.validationFailed, "mode must be finish or cancel", extra: ["field": "mode"])
        }
        let removed = try stored { () throws(StoreError) in try store.deleteSession(id: id, cancel: mode == "cancel") }
        engine?.wake()
        if removed { return HTTPResponse(status: 204) }
        guard let (session, counts) = try stored({ () throws(StoreError) in try store.session(id: id) }) else {
            return HTTPResponse(status: 204)
        }
        return API.json(202, session.json(taskCounts: counts))
    }

    // MARK: Tasks

    @Sendable func createTasks(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = try sessionID(request)
        guard let (session, counts) = try stored({ () throws(StoreError) in try store.session(id: id) }) else {
            throw Problem(.notFound, "no session \(id)")
        }
        let open = TaskState.unfinished.reduce(0) { $0 + (counts[$1] ?? 0) }
        if let engine, !engine.policy.transfersEnabled {
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
                throw Problem(.validationFailed, "a batch holds 1 to \(options.maxTasksPerBatch) tasks", extra: ["field": "tasks"])
            }
            items = array.enumerated().map { ($0.element, "tasks[\($0.offset)]") }
        } else {
            items = [(value, "")]
        }
        guard open + items.count <= options.maxOpenTasksPerSession else {
            throw Problem(.tooManyTasks, "the session holds \(open) unfinished tasks; at most \(options.maxOpenTasksPerSession) are allowed (--max-open-tasks)")
        }
        let now = clock.now()
        var records: [TaskRecord] = []
        records.reserveCapacity(items.count)
        for (item, path) in items {
            records.append(try makeTask(item, path: path, session: session, now: now))
        }
        let results = try stored { () throws(StoreError) in try store.createTasks(sessionID: id, records) }
        engine?.wake()
        let created = results.contains { $0.1 }
        if isBatch {
            return API.json(created ? 201 : 200, ["tasks": .array(results.map { taskJSON($0.0) })])
        }
        return API.json(created ? 201 : 200, taskJSON(results[0].0))
    }

    func makeTask(_ value: JSON, path: String, session: SessionRecord, now: Timestamp) throws(Problem) -> TaskRecord {
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
        let inspected = download.map { spec in
            options.allowedRoots.inspectDestination(spec.destination, overwrite: spec.overwrite).map {
                FileInfo(path: $0, size: 0, modifiedAtNanoseconds: 0)
            }
        } ?? options.allowedRoots.inspect(draft.filePath)
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
            id: RandomID.make(prefix: "tsk_"), sessionID: session.id, file: file, request: draft.request, upload: draft.upload,
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
                throw Problem(.validationFailed, "state must be one of \(TaskState.allCases.map(\.rawValue).joined(separator: ", "))",
                              extra: ["field": "state"])
            }
            state = parsed
        }
        let (limit, cursor) = try page(request)
        let page = try stored { () throws(StoreError) in try store.tasks(sessionID: id, state: state, cursor: cursor, limit: limit) }
        return API.json(200, ["tasks": .array(page.tasks.map(taskJSON)), "next_cursor": page.nextCursor.map { .string($0) } ?? .null])
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
        API.json(200, taskJSON(try existingTask(request)))
    }

    @Sendable func patchTask(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let current = try existingTask(request)
        guard let (session, _) = try stored({ () throws(StoreError) in try store.session(id: current.sessionID) }) else {
            throw Problem(.notFound, "the task's session is gone")
        }
        let value = try body(request)
        let updated = try validated {
            let change = try TaskPatch.decode(value, session: session.configuration)
            return try store.updateTask(id: current.id) { task in try change.apply(to: &task, session: session.configuration) }
        }
        engine?.wake(policy: true)
        return API.json(200, taskJSON(updated))
    }

    @Sendable func deleteTask(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = request.parameter("id")
        try stored { () throws(StoreError) in try store.deleteTask(id: id) }
        return HTTPResponse(status: 204)
    }

    func command(_ command: TaskCommand, _ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let id = request.parameter("id")
        let task = try stored { () throws(StoreError) in try store.apply(command, to: id) }
        engine?.wake()
        return API.json(200, taskJSON(task))
    }
}
