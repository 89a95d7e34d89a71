import BackhaulCore
import JSONCodec

/// The daemon's API, one method per call, with typed answers and typed errors: a problem+json
/// answer is `APIError.problem`, a daemon out of reach `.transport`, an answer that does not read
/// `.unexpectedAnswer`. Addresses come from `Endpoint`. Not Sendable: one per thread.
public final class BackhaulClient {
    /// The daemon's URL without a trailing slash.
    public let baseURL: String
    private let token: String?
    private let transport: any APITransport

    public init(url: String, token: String?, transport: any APITransport = CurlTransport()) {
        baseURL = url.hasSuffix("/") ? String(url.dropLast()) : url
        self.token = token
        self.transport = transport
    }

    // MARK: Calls

    public func info() throws(APIError) -> APIInfo { try APIInfo(json: call("GET", .info)) }

    public func sessions() throws(APIError) -> [APISession] {
        try AnswerReader(call("GET", .sessions)).array("sessions") { (item, path) throws(APIError) in
            try APISession(json: item, at: path)
        }
    }

    public func session(_ id: String) throws(APIError) -> APISession { try APISession(json: call("GET", .session(id))) }

    /// `PUT /v1/sessions/{id}` with the default configuration; a session that exists already (with
    /// any configuration) is fine.
    public func ensureSession(_ id: String) throws(APIError) {
        do {
            _ = try call("PUT", .session(id), body: ["configuration": [:]])
        } catch .problem(let problem) where problem.code == .sessionExists {
            return
        }
    }

    /// Hands tasks over in one batch; the tasks as created, in order.
    public func createTasks(_ tasks: [NewTask], session: String) throws(APIError) -> [APITask] {
        let answer = try call("POST", .tasks(session: session), body: ["tasks": .array(tasks.map(\.json))])
        return try AnswerReader(answer).array("tasks") { (item, path) throws(APIError) in try APITask(json: item, at: path) }
    }

    /// One page of a session's tasks (in `state`, when given).
    public func tasks(session: String, state: String? = nil, limit: Int = 500, cursor: String? = nil)
        throws(APIError) -> TaskPage
    {
        try TaskPage(json: call("GET", .tasks(session: session, state: state, limit: limit, cursor: cursor)))
    }

    /// Every task of a session (in `state`, when given), page by page.
    public func allTasks(session: String, state: String? = nil) throws(APIError) -> [APITask] {
        var tasks: [APITask] = []
        var cursor: String?
        repeat {
            let page = try self.tasks(session: session, state: state, cursor: cursor)
            tasks += page.tasks
            cursor = page.nextCursor.flatMap { $0.isEmpty ? nil : $0 }
        } while cursor != nil
        return tasks
    }

    public func task(_ id: String) throws(APIError) -> APITask { try APITask(json: call("GET", .task(id))) }

    /// The task's attempts, newest first.
    public func attempts(task id: String) throws(APIError) -> [APIAttempt] {
        try AnswerReader(call("GET", .attempts(task: id))).array("attempts") { (item, path) throws(APIError) in
            try APIAttempt(json: item, at: path)
        }
    }

    /// `cancel`, `suspend` or `resume`; the task as it is after.
    public func perform(_ command: TaskCommand, task id: String) throws(APIError) -> APITask {
        try APITask(json: call("POST", .command(command, task: id)))
    }

    public func network() throws(APIError) -> APINetwork { try APINetwork(json: call("GET", .network)) }

    public func setNetwork(_ network: NetworkOverride) throws(APIError) -> APINetwork {
        try APINetwork(json: call("PUT", .network, body: network.json))
    }

    /// A consistent copy of the daemon's state, written by the daemon to `path` (absolute, new).
    public func backup(to path: String) throws(APIError) -> JSON {
        try call("POST", .backup, body: ["path": .string(path)])
    }

    /// Back to detection.
    public func resetNetwork() throws(APIError) -> APINetwork { try APINetwork(json: call("DELETE", .network)) }

    public func webhooks(session: String) throws(APIError) -> [APIWebhook] {
        try AnswerReader(call("GET", .webhooks(session: session))).array("webhooks") { (item, path) throws(APIError) in
            try APIWebhook(json: item, at: path)
        }
    }

    /// A new subscription, with its secret (shown this once).
    public func addWebhook(session: String, url: String) throws(APIError) -> APIWebhook {
        try APIWebhook(json: call("POST", .webhooks(session: session), body: ["url": .string(url)]))
    }

    /// Follows `GET /v1/events` (one session's, when given), handing each event to `receive` until
    /// it or `tick` (about once a second) returns false, or the stream ends. A stream that broke
    /// after it opened has ended too; only one that never opened is `.transport`. `lastEventID`
    /// resumes after that event. Returns the id of the last event received.
    public func followEvents(
        session: String?, after lastEventID: String?, receive: @escaping (APIEvent) -> Bool,
        tick: @escaping () -> Bool
    ) throws(APIError) -> String? {
        var parser = ServerSentEventParser()
        var last = lastEventID
        var opened = false
        let headers = authorization + ["Accept: text/event-stream"] + (lastEventID.map { ["Last-Event-ID: \($0)"] } ?? [])
        let request = APIRequest(method: "GET", url: baseURL + Endpoint.events(session: session).pathAndQuery, headers: headers)
        let response: APIResponse
        do {
            response = try transport.stream(
                request,
                receive: { bytes in
                    opened = true
                    for event in parser.feed(bytes) {
                        last = event.id ?? last
                        guard receive(APIEvent(event)) else { return false }
                    }
                    return true
                }, tick: tick)
        } catch {
            guard opened else { throw .transport(TransportFailure(baseURL: baseURL, reason: error.message)) }
            return last
        }
        guard (200..<300).contains(response.status) else {
            throw .problem(APIProblem(status: response.status, body: response.body))
        }
        return last
    }

    // MARK: The one exchange

    private var authorization: [String] { token.map { ["Authorization: Bearer \($0)"] } ?? [] }

    /// Sends one request; the answer's JSON for a 2xx, the problem otherwise.
    private func call(_ method: String, _ endpoint: Endpoint, body: JSON? = nil) throws(APIError) -> JSON {
        let request = APIRequest(
            method: method, url: baseURL + endpoint.pathAndQuery, headers: authorization, body: body?.serializedBytes())
        let response: APIResponse
        do {
            response = try transport.send(request)
        } catch {
            throw .transport(TransportFailure(baseURL: baseURL, reason: error.message))
        }
        guard (200..<300).contains(response.status) else {
            throw .problem(APIProblem(status: response.status, body: response.body))
        }
        do {
            return try JSON.parse(response.body, maxDepth: 64)
        } catch {
            throw .unexpectedAnswer(
                "\(method) \(endpoint.pathAndQuery) answered \(response.status) with a body that is not JSON (\(error))")
        }
    }
}
