import BackhaulCore
import BackhaulFiles
import BackhaulQueue
import JSONCodec
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
    /// This daemon's name in `GET /v1/nodes`, and when it started.
    public var nodeID = "localhost"
    public var startedAt: Timestamp = SystemClock().now()
    /// The removal of files by the store's commits, for its failure count (`/metrics`).
    public var fileRemoval: FileRemoval?

    public init(allowedRoots: AllowedRoots) { self.allowedRoots = allowedRoots }
}

/// The REST API's handlers. Each takes a request value and returns a response value; none
/// knows the transport (tests call `router` in process).
public final class API: Sendable {
    let store: any StateStore
    /// The transfer engine's live figures (nil in tests that run the API alone).
    let status: (any TransferStatus)?
    /// The network override and run-time policy (nil in tests that run the API alone).
    let settings: ServiceSettings?
    let options: APIOptions
    let clock: any Clock
    let logger: Logger
    let eventFeed: EventFeed?
    /// What the HTTP layer measured of each request, shown by `/metrics`.
    let requestMetrics: RequestMetrics?

    public init(
        store: any StateStore, status: (any TransferStatus)?, settings: ServiceSettings?, eventFeed: EventFeed? = nil,
        requestMetrics: RequestMetrics? = nil, options: APIOptions,
        clock: any Clock = SystemClock(), logger: Logger
    ) {
        self.store = store
        self.requestMetrics = requestMetrics
        self.status = status
        self.settings = settings
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

    static func json(_ status: Int, bytes: [UInt8]) -> HTTPResponse {
        HTTPResponse(status: status, headers: [("Content-Type", "application/json")], body: bytes)
    }

    static func json(_ status: Int, _ value: JSON) -> HTTPResponse { json(status, bytes: value.serializedBytes()) }

    /// JSON already written as text.
    static func json(_ status: Int, text: String) -> HTTPResponse { json(status, bytes: Array(text.utf8)) }

    static func json(_ status: Int, _ writer: JSONWriter) -> HTTPResponse { json(status, bytes: writer.bytes) }

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
        case .sessionExists:
            return Problem(.sessionExists, "the session exists with a different configuration; use PATCH to change it")
        case .conflict(let message): return Problem(.conflict, message)
        case .storageFull: return Problem(.insufficientStorage, "the state directory is full; nothing was changed")
        case .invalid(let error): return problem(error)
        case .tooManyTasks(let open, let limit):
            return Problem(
                .tooManyTasks, "the session holds \(open) unfinished tasks; at most \(limit) are allowed (--max-open-tasks)")
        case .corrupt(let message):
            return Problem(.storeCorrupt, "the state database holds a record this build cannot read: \(message)")
        case .newerSchema(let found, let supported):
            return Problem(.storeCorrupt, "the state database has schema version \(found); this build reads up to \(supported)")
        case .syncFailed(let failure) where failure.isDiskFull:
            return Problem(
                .insufficientStorage,
                "the state directory is full and could not be synced (\(failure.errnoName)); the write may not have been kept, and backhauld takes no more writes until it restarts"
            )
        case .syncFailed(let failure):
            return Problem(
                .stateUnavailable,
                "the state could not be synced (\(failure.errnoName)); the write may not have been kept, and backhauld takes no more writes until it restarts"
            )
        case .unavailable(let message):
            return Problem(.unavailable, "the state database cannot be reached; nothing was changed: \(message)")
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

    /// Writes a task as its clients see it: live progress from the engine while it runs, and the
    /// host's connection limit as the reason a queued task waits while its host is saturated.
    func writeTask(_ task: TaskRecord, to writer: inout JSONWriter) {
        var live: LiveProgress?
        if task.state == .running { live = status?.liveProgress(taskID: task.id) }
        var shown: WaitingReason?
        if task.state == .queued, status?.isHostSaturated(sessionID: task.sessionID, hostKey: task.request.hostKey) == true {
            shown = .hostConnectionLimit
        }
        task.writeJSON(to: &writer, live: live, waitingReason: shown)
    }

    func taskResponse(_ status: Int, _ task: TaskRecord) -> HTTPResponse {
        var writer = JSONWriter()
        writeTask(task, to: &writer)
        return API.json(status, writer)
    }

    /// `{"tasks": [...]}`; a page of a list has `next_cursor` too (null on the last page).
    func tasksResponse(_ status: Int, _ tasks: [TaskRecord], isPage: Bool = false, nextCursor: String? = nil) -> HTTPResponse {
        var writer = JSONWriter(capacity: 1024 * max(1, tasks.count))
        writer.object { object in
            object.key("tasks")
            object.array { array in
                for task in tasks {
                    writeTask(task, to: &array)
                }
            }
            if isPage {
                object.key("next_cursor")
                object.string(nextCursor)
            }
        }
        return API.json(status, writer)
    }

    // MARK: Operations

    @Sendable func health(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        API.json(200, ["status": "ok"])
    }

    @Sendable func ready(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        if let failure = store.failure {
            throw Problem(.stateUnavailable, "a sync of the state failed (\(failure)); backhauld restarts to read it again")
        }
        guard store.isWritable() else { throw Problem(.unavailable, "the state database cannot be written") }
        guard status?.isRunning ?? false else { throw Problem(.unavailable, "the transfer engine is not running") }
        return API.json(200, ["status": "ready"])
    }

    @Sendable func info(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        var object = options.info
        object["version"] = .string(BackhaulVersion.string)
        object["protocols"] = .array(
            UploadProtocol.allCases.filter { UploadProtocol.supported.contains($0) }.map { .string($0.rawValue) })
        let counts = try stored { () throws(StoreError) in try store.taskCounts() }
        var tasks = JSONObject()
        for state in TaskState.allCases { tasks[state.rawValue] = .int(Int64(counts[state] ?? 0)) }
        object["task_counts"] = .object(tasks)
        object["state"] = API.stateJSON(store.salvage, damage: store.damage)
        return API.json(200, .object(object))
    }
}

extension API {
    /// `/v1/info`'s `state`: the newest salvage of a damaged state database (its members null when
    /// there was none; `rows_lost` is null too when what was lost could not be counted), and damage
    /// found since the start (its members null when none was).
    static func stateJSON(_ salvage: SalvageReport?, damage: StateDamage?) -> JSON {
        var object: JSONObject = [
            "salvaged_at": salvage.map { .string(RFC3339.format($0.at)) } ?? .null,
            "salvaged_from": salvage.map { .string($0.directory) } ?? .null,
            "salvage_reason": salvage.map { .string($0.reason) } ?? .null,
            "rows_copied": salvage.map { .int(Int64($0.rowsCopied)) } ?? .null,
            "rows_lost": salvage?.rowsLost.map { .int(Int64($0)) } ?? .null,
        ]
        object["damage_found_at"] = damage.map { .string(RFC3339.format($0.at)) } ?? .null
        object["damage"] = damage.map { .string($0.reason) } ?? .null
        object["damage_found_by"] = damage.map { .string($0.foundBy) } ?? .null
        return .object(object)
    }
}
