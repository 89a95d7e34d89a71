#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// backhauld's API from Swift: one async method per call, answers as Codable models of
/// OpenAPI/backhaul.yaml, and typed errors (`APIError`): a problem+json answer is `.problem`
/// with its stable `code`, a daemon out of reach `.transport`, an answer that does not read
/// `.unexpectedAnswer`. Requests go over libcurl on threads of the transport's own, so a call
/// awaits without holding a thread of the caller's. Safe to share between tasks.
///
/// ```swift
/// let client = BackhaulClient(url: "http://127.0.0.1:8427")
/// try await client.ensureSession("camera")
/// let tasks = try await client.createTasks([.upload(file: "/data/clip.mp4", url: "https://in.example/clip.mp4")],
///                                          session: "camera")
/// ```
public final class BackhaulClient: Sendable {
    /// The daemon's URL without a trailing slash.
    public let baseURL: String
    private let token: String?
    private let transport: any APITransport

    /// `url`: the daemon (`http://127.0.0.1:8427` by default); `token`: a bearer token when the
    /// daemon asks for one.
    public init(url: String = "http://127.0.0.1:8427", token: String? = nil, transport: any APITransport = CurlTransport()) {
        baseURL = url.hasSuffix("/") ? String(url.dropLast()) : url
        self.token = token
        self.transport = transport
    }

    // MARK: Calls

    /// `GET /v1/info`: version, protocols, task counts, the effective configuration.
    public func info() async throws(APIError) -> APIInfo { try await send(.info) }

    /// `GET /v1/sessions`.
    public func sessions() async throws(APIError) -> [APISession] { try await send(.sessions) }

    /// `GET /v1/sessions/{id}`.
    public func session(_ id: String) async throws(APIError) -> APISession { try await send(.session(id)) }

    /// `PUT /v1/sessions/{id}`: a new session, or the same one back; one with another
    /// configuration is `session_exists`.
    public func createSession(_ id: String, configuration: SessionConfiguration = .init()) async throws(APIError)
        -> APISession
    {
        try await send(.createSession(id, configuration: configuration))
    }

    /// `PUT /v1/sessions/{id}` with the default configuration; a session that exists already (with
    /// any configuration) is fine.
    public func ensureSession(_ id: String) async throws(APIError) {
        do {
            _ = try await send(.createSession(id))
        } catch .problem(let problem) where problem.code == .sessionExists {
            return
        }
    }

    /// `PATCH /v1/sessions/{id}`: configuration merged, enabled or not, pending work cancelled.
    public func updateSession(_ id: String, _ patch: SessionPatch) async throws(APIError) -> APISession {
        try await send(.updateSession(id, patch))
    }

    /// `DELETE /v1/sessions/{id}`: the session while it finishes, or nil once it is gone.
    public func deleteSession(_ id: String, mode: SessionEnd = .finish) async throws(APIError) -> APISession? {
        try await send(.deleteSession(id, mode: mode))
    }

    /// `POST /v1/sessions/{id}/tasks`: the tasks in one batch, all or nothing; the tasks as
    /// created, in order.
    public func createTasks(_ tasks: [NewTask], session: String) async throws(APIError) -> [APITask] {
        try await send(.createTasks(tasks, session: session))
    }

    /// One page of a session's tasks (in `state`, when given), oldest first.
    public func tasks(session: String, state: TaskState? = nil, limit: Int = 500, cursor: String? = nil)
        async throws(APIError) -> TaskPage
    {
        try await send(.tasks(session: session, state: state, limit: limit, cursor: cursor))
    }

    /// Every task of a session (in `state`, when given), page by page.
    public func allTasks(session: String, state: TaskState? = nil) async throws(APIError) -> [APITask] {
        var tasks: [APITask] = []
        var cursor: String?
        repeat {
            let page = try await self.tasks(session: session, state: state, cursor: cursor)
            tasks += page.tasks
            cursor = page.nextCursor.flatMap { $0.isEmpty ? nil : $0 }
        } while cursor != nil
        return tasks
    }

    /// `GET /v1/tasks/{id}`, with live progress while it runs.
    public func task(_ id: String) async throws(APIError) -> APITask { try await send(.task(id)) }

    /// `PATCH /v1/tasks/{id}`: priority, headers, URL, start time, configuration.
    public func updateTask(_ id: String, _ patch: TaskPatch) async throws(APIError) -> APITask {
        try await send(.updateTask(id, patch))
    }

    /// `DELETE /v1/tasks/{id}`: a finished task's record removed (`conflict` while unfinished).
    public func deleteTask(_ id: String) async throws(APIError) { try await send(.deleteTask(id)) }

    /// The task's attempts, newest first.
    public func attempts(task id: String) async throws(APIError) -> [APIAttempt] { try await send(.attempts(task: id)) }

    /// `cancel`, `suspend` or `resume`; the task as it is after.
    public func perform(_ command: TaskCommand, task id: String) async throws(APIError) -> APITask {
        try await send(.perform(command, task: id))
    }

    /// Cancels (reason `user_cancelled`); a running transfer stops.
    public func cancel(task id: String) async throws(APIError) -> APITask { try await perform(.cancel, task: id) }
    /// Suspends an unfinished task; it keeps its place.
    public func suspend(task id: String) async throws(APIError) -> APITask { try await perform(.suspend, task: id) }
    /// Resumes a suspended task (back to `queued`).
    public func resume(task id: String) async throws(APIError) -> APITask { try await perform(.resume, task: id) }

    /// The network the policy sees.
    public func network() async throws(APIError) -> APINetwork { try await send(.network) }

    /// The daemons that share the state (docs/fleet.md).
    public func nodes() async throws(APIError) -> [APINode] { try await send(.nodes).nodes }

    /// Overrides detection.
    public func setNetwork(_ network: NetworkOverride) async throws(APIError) -> APINetwork {
        try await send(.setNetwork(network))
    }

    /// Back to detection.
    public func resetNetwork() async throws(APIError) -> APINetwork { try await send(.resetNetwork) }

    /// The service policy in force.
    public func policy() async throws(APIError) -> APIValue { try await send(.policy) }

    /// A consistent copy of the daemon's state, written by the daemon to `path` (absolute, new).
    public func backup(to path: String) async throws(APIError) -> BackupResult { try await send(.backup(to: path)) }

    /// The session's subscriptions, without their secrets.
    public func webhooks(session: String) async throws(APIError) -> [APIWebhook] { try await send(.webhooks(session: session)) }

    /// A new subscription, with its secret (shown this once).
    public func addWebhook(session: String, url: String, events: [String]? = nil, secret: String? = nil)
        async throws(APIError) -> APIWebhook
    {
        try await send(.addWebhook(session: session, url: url, events: events, secret: secret))
    }

    /// Removes a subscription; its pending deliveries are abandoned.
    public func deleteWebhook(_ id: String) async throws(APIError) { try await send(.deleteWebhook(id)) }

    /// The event log as it happens (`GET /v1/events`), one session's when given, after the
    /// event `after` when given (the events kept since then come first). See `APIEventStream`
    /// for how it ends.
    public func events(session: String? = nil, after lastEventID: String? = nil) -> APIEventStream {
        var headers = authorization + ["Accept: text/event-stream"]
        if let lastEventID { headers.append("Last-Event-ID: \(lastEventID)") }
        let request = APIRequest(method: "GET", url: baseURL + Endpoint.events(session: session).pathAndQuery, headers: headers)
        return APIEventStream(request: request, transport: transport, baseURL: baseURL)
    }

    // MARK: The one exchange

    private var authorization: [String] { token.map { ["Authorization: Bearer \($0)"] } ?? [] }

    /// Sends a call; its answer.
    public func send<Answer>(_ call: APICall<Answer>) async throws(APIError) -> Answer { try await reply(call).value }

    /// Sends a call; its answer, with the body as the daemon sent it.
    public func reply<Answer>(_ call: APICall<Answer>) async throws(APIError) -> APIReply<Answer> {
        var body: [UInt8]?
        if let content = call.body {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            do {
                body = Array(try encoder.encode(content))
            } catch {
                throw .invalidRequest("\(call.method) \(call.endpoint): \(error)")
            }
        }
        let request = APIRequest(
            method: call.method, url: baseURL + call.endpoint.pathAndQuery, headers: authorization, body: body)
        let response: APIResponse
        do {
            response = try await transport.send(request)
        } catch {
            throw .transport(TransportFailure(baseURL: baseURL, reason: error.message))
        }
        guard (200..<300).contains(response.status) else {
            throw .problem(APIProblem(status: response.status, body: response.body))
        }
        do {
            return APIReply(value: try call.read(response), status: response.status, body: response.body)
        } catch {
            throw .unexpectedAnswer("\(call.method) \(call.endpoint) answered \(response.status): \(error.summary)")
        }
    }
}
