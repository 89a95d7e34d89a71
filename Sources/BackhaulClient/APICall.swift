#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// One call of the API with the type of its answer: the method, the address, the JSON body, and
/// how the answer reads. `BackhaulClient` has a method for each; `BackhaulClient.reply(_:)` also
/// gives the answer's bytes as sent (the command line prints them for `--json`).
public struct APICall<Answer: Sendable>: Sendable {
    public var method: String
    public var endpoint: Endpoint
    /// Encoded when the call is sent.
    public var body: (any Encodable & Sendable)?
    let read: @Sendable (APIResponse) throws(DecodingFailure) -> Answer

    init(
        _ method: String, _ endpoint: Endpoint, body: (any Encodable & Sendable)? = nil,
        read: @escaping @Sendable (APIResponse) throws(DecodingFailure) -> Answer
    ) {
        self.method = method
        self.endpoint = endpoint
        self.body = body
        self.read = read
    }
}

/// An answer read, with its body as it came.
public struct APIReply<Answer: Sendable>: Sendable {
    public var value: Answer
    public var status: Int
    /// The JSON the daemon sent.
    public var body: [UInt8]
}

/// Why an answer did not read, for `APIError.unexpectedAnswer`.
struct DecodingFailure: Error {
    var summary: String
}

extension APICall where Answer: Decodable {
    /// A call whose answer is `Answer` itself.
    init(_ method: String, _ endpoint: Endpoint, body: (any Encodable & Sendable)? = nil) {
        self.init(method, endpoint, body: body) { (response) throws(DecodingFailure) in try decodeJSON(Answer.self, response.body)
        }
    }
}

/// Reads a JSON body; a failure names the member.
func decodeJSON<T: Decodable>(_ type: T.Type, _ body: [UInt8]) throws(DecodingFailure) -> T {
    do {
        return try JSONDecoder().decode(T.self, from: Data(body))
    } catch let error as DecodingError {
        throw DecodingFailure(summary: error.summary)
    } catch {
        throw DecodingFailure(summary: "\(error)")
    }
}

/// The answers that wrap a list in one member.
private struct SessionList: Decodable { var sessions: [APISession] }
private struct TaskList: Decodable { var tasks: [APITask] }
private struct AttemptList: Decodable { var attempts: [APIAttempt] }
private struct WebhookList: Decodable { var webhooks: [APIWebhook] }

/// The bodies the calls send.
private struct SessionCreation: Encodable, Sendable { var configuration: SessionConfiguration }
private struct TaskBatch: Encodable, Sendable { var tasks: [NewTask] }
private struct BackupRequest: Encodable, Sendable { var path: String }
private struct WebhookCreation: Encodable, Sendable {
    var url: String
    var events: [String]?
    var secret: String?
}

extension APICall {
    public static var info: APICall<APIInfo> { .init("GET", .info) }

    public static var sessions: APICall<[APISession]> {
        .init("GET", .sessions) { (response) throws(DecodingFailure) in try decodeJSON(SessionList.self, response.body).sessions }
    }

    public static func session(_ id: String) -> APICall<APISession> { .init("GET", .session(id)) }

    /// `PUT /v1/sessions/{id}`: created (201), or the same one back (200); another configuration
    /// is 409 `session_exists`.
    public static func createSession(_ id: String, configuration: SessionConfiguration = .init()) -> APICall<APISession> {
        .init("PUT", .session(id), body: SessionCreation(configuration: configuration))
    }

    public static func updateSession(_ id: String, _ patch: SessionPatch) -> APICall<APISession> {
        .init("PATCH", .session(id), body: patch)
    }

    /// The session while it finishes (202), or nil once it is gone (204).
    public static func deleteSession(_ id: String, mode: SessionEnd) -> APICall<APISession?> {
        .init("DELETE", .session(id, mode: mode)) { (response) throws(DecodingFailure) in
            response.status == 204 ? nil : try decodeJSON(APISession.self, response.body)
        }
    }

    /// One batch, all or nothing; the tasks as created, in order.
    public static func createTasks(_ tasks: [NewTask], session: String) -> APICall<[APITask]> {
        .init("POST", .tasks(session: session), body: TaskBatch(tasks: tasks)) { (response) throws(DecodingFailure) in
            try decodeJSON(TaskList.self, response.body).tasks
        }
    }

    public static func tasks(session: String, state: TaskState? = nil, limit: Int = 500, cursor: String? = nil)
        -> APICall<TaskPage>
    {
        .init("GET", .tasks(session: session, state: state?.rawValue, limit: limit, cursor: cursor))
    }

    public static func task(_ id: String) -> APICall<APITask> { .init("GET", .task(id)) }

    public static func updateTask(_ id: String, _ patch: TaskPatch) -> APICall<APITask> {
        .init("PATCH", .task(id), body: patch)
    }

    /// Removes a finished task's record.
    public static func deleteTask(_ id: String) -> APICall<Void> {
        .init("DELETE", .task(id)) { (_) throws(DecodingFailure) in () }
    }

    /// The task's attempts, newest first.
    public static func attempts(task id: String) -> APICall<[APIAttempt]> {
        .init("GET", .attempts(task: id)) { (response) throws(DecodingFailure) in
            try decodeJSON(AttemptList.self, response.body).attempts
        }
    }

    public static func perform(_ command: TaskCommand, task id: String) -> APICall<APITask> {
        .init("POST", .command(command, task: id))
    }

    public static var network: APICall<APINetwork> { .init("GET", .network) }
    public static var nodes: APICall<APINodeList> { .init("GET", .nodes) }

    public static func setNetwork(_ network: NetworkOverride) -> APICall<APINetwork> {
        .init("PUT", .network, body: network)
    }

    public static var resetNetwork: APICall<APINetwork> { .init("DELETE", .network) }

    /// The service policy in force (OpenAPI/backhaul.yaml, `Policy`).
    public static var policy: APICall<APIValue> { .init("GET", .policy) }

    public static func backup(to path: String) -> APICall<BackupResult> {
        .init("POST", .backup, body: BackupRequest(path: path))
    }

    public static func webhooks(session: String) -> APICall<[APIWebhook]> {
        .init("GET", .webhooks(session: session)) { (response) throws(DecodingFailure) in
            try decodeJSON(WebhookList.self, response.body).webhooks
        }
    }

    public static func addWebhook(session: String, url: String, events: [String]? = nil, secret: String? = nil)
        -> APICall<APIWebhook>
    {
        .init("POST", .webhooks(session: session), body: WebhookCreation(url: url, events: events, secret: secret))
    }

    public static func deleteWebhook(_ id: String) -> APICall<Void> {
        .init("DELETE", .webhook(id)) { (_) throws(DecodingFailure) in () }
    }
}
