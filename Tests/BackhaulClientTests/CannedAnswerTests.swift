import BackhaulClient
import BackhaulTesting
import JSONCodec
import Testing

@Suite("BackhaulClient with canned answers: decoding, typed errors, encoded addresses")
struct CannedAnswerTests {
    static let base = CannedTransport.base

    func client(_ transport: CannedTransport, token: String? = nil) -> BackhaulClient {
        BackhaulClient(url: Self.base + "/", token: token, transport: transport)
    }

    @Test("an upload task decodes into its typed fields, and keeps the object as sent")
    func uploadTask() async throws {
        let transport = CannedTransport(["GET /v1/tasks/tsk_a": (200, Canned.task())])
        let reply = try await client(transport).reply(.task("tsk_a"))
        let task = reply.value
        #expect(task.id == "tsk_a" && task.sessionID == "cli" && task.kind == .upload && task.state == .running)
        #expect(task.localPath == "/data/clip.bin" && task.destination == nil && task.uploadProtocol == "chunked")
        #expect(task.file?.size == 4096 && task.upload?.chunkSize == 1024 && task.request.method == "PUT")
        #expect(task.url == "https://ingest.example/clips/clip.bin" && task.attempts == 2)
        #expect(
            task.progress
                == TaskProgress(bytesSent: 1024, bytesTotal: 4096, fraction: 0.25, bytesPerSecond: 512, etaSeconds: 6))
        #expect(
            task.error == nil && task.lastError == nil && task.responseStatus == nil && task.createdAt == "2026-11-20T10:00:01Z")
        #expect(reply.body == Array(Canned.task().utf8) && reply.status == 200)
    }

    @Test("a download task: destination, bytes received, a size not known yet")
    func downloadTask() async throws {
        let transport = CannedTransport(["GET /v1/tasks/tsk_d": (200, Canned.task(id: "tsk_d", kind: "download"))])
        let task = try await client(transport).task("tsk_d")
        #expect(
            task.kind == .download && task.localPath == "/data/map.tiles" && task.file == nil && task.download?.overwrite == false
                && task.uploadProtocol == nil)
        #expect(task.progress.bytesReceived == 300 && task.progress.moved == 300 && task.progress.bytesTotal == nil)
        #expect(task.progress.etaSeconds == nil)
    }

    @Test("error, last error and the final response")
    func failures() async throws {
        let extra = """
            , "error": {"code": -1011, "name": "bad_server_response", "message": "the server answered 503", "http_status": 503},
            "last_error": {"code": -1004, "name": "cannot_connect_to_host", "message": "refused", "http_status": null,
                           "at": "2026-11-20T10:00:09Z"},
            "response": {"status": 503, "headers": {}, "body": "", "body_encoding": "utf8"}
            """
        let transport = CannedTransport(["GET /v1/tasks/tsk_f": (200, Canned.task(id: "tsk_f", state: "failed", extra: extra))])
        let task = try await client(transport).task("tsk_f")
        #expect(task.state == .failed && task.responseStatus == 503)
        #expect(task.error?.code == -1011 && task.error?.name == "bad_server_response" && task.error?.httpStatus == 503)
        #expect(task.error?.at == nil)
        #expect(task.lastError?.name == "cannot_connect_to_host" && task.lastError?.httpStatus == nil)
        #expect(task.lastError?.at == "2026-11-20T10:00:09Z")
    }

    @Test("every page of a session's tasks, the cursor sent back encoded")
    func pages() async throws {
        let first = #"{"tasks": [\#(Canned.task(id: "tsk_1"))], "next_cursor": "a+b/c=="}"#
        let last = #"{"tasks": [\#(Canned.task(id: "tsk_2"))], "next_cursor": null}"#
        let transport = CannedTransport([
            "GET /v1/sessions/cli/tasks?limit=500&state=running": (200, first),
            "GET /v1/sessions/cli/tasks?limit=500&state=running&cursor=a%2Bb%2Fc%3D%3D": (200, last),
        ])
        let tasks = try await client(transport).allTasks(session: "cli", state: .running)
        #expect(tasks.map(\.id) == ["tsk_1", "tsk_2"])
        #expect(transport.sent.count == 2)
    }

    @Test(
        "ids and query values are percent-encoded: an id cannot reach another route",
        arguments: [
            (Endpoint.task("tsk_a"), "/v1/tasks/tsk_a"),
            (Endpoint.task("../sessions"), "/v1/tasks/..%2Fsessions"),
            (Endpoint.task(".."), "/v1/tasks/%2E%2E"),
            (Endpoint.task("a b?c#d"), "/v1/tasks/a%20b%3Fc%23d"),
            (Endpoint.command(.suspend, task: "tsk_é"), "/v1/tasks/tsk_%C3%A9/suspend"),
            (Endpoint.attempts(task: "tsk_a"), "/v1/tasks/tsk_a/attempts"),
            (Endpoint.events(session: nil), "/v1/events"),
            (Endpoint.events(session: "cam-1&all=1"), "/v1/events?session=cam-1%26all%3D1"),
            (Endpoint.tasks(session: "s.1", state: nil, limit: 10, cursor: nil), "/v1/sessions/s.1/tasks?limit=10"),
            (Endpoint.webhooks(session: "cli"), "/v1/sessions/cli/webhooks"),
        ])
    func addresses(_ endpoint: Endpoint, _ expected: String) {
        #expect(endpoint.pathAndQuery == expected)
    }

    @Test("a problem+json answer is .problem with its status, code and detail")
    func problem() async throws {
        let transport = CannedTransport(["GET /v1/tasks/tsk_nope": (404, Canned.problem404)])
        await #expect(
            throws: APIError.problem(
                APIProblem(
                    status: 404, code: .notFound, title: "No such resource", detail: "no task tsk_nope",
                    type: "https://backhaul.dev/problems/not_found"))
        ) {
            try await client(transport).task("tsk_nope")
        }
        let refused = APIProblem(status: 404, body: Array(Canned.problem404.utf8))
        #expect(refused.description == "no task tsk_nope (not_found)")
    }

    @Test("a validation problem names its field")
    func validationProblem() {
        let body =
            #"{"status": 422, "code": "validation_failed", "title": "x", "detail": "state must be one of …", "field": "state"}"#
        let problem = APIProblem(status: 422, body: Array(body.utf8))
        #expect(problem.code == .validationFailed && problem.field == "state" && problem.detail == "state must be one of …")
    }

    @Test("an error status without a problem body still gives the status")
    func bareErrorStatus() async {
        let transport = CannedTransport(["GET /v1/sessions": (502, "<html>Bad Gateway</html>")])
        await #expect(throws: APIError.problem(APIProblem(status: 502, code: nil, detail: "HTTP 502"))) {
            try await client(transport).sessions()
        }
        #expect(APIProblem(status: 502, body: []).description == "HTTP 502")
    }

    @Test("a daemon out of reach is .transport, naming where it was looked for")
    func transport() async {
        let failure = TransportFailure(baseURL: Self.base, reason: "curl error 7: Could not connect to server")
        await #expect(throws: APIError.transport(failure)) { try await client(CannedTransport()).sessions() }
        #expect(
            failure.description == "cannot reach backhauld at http://127.0.0.1:8427: curl error 7: Could not connect to server")
    }

    /// An answer body and what the error must say of it.
    struct Unreadable: Sendable, CustomTestStringConvertible {
        var body: String
        var expected: String
        var testDescription: String { expected }
        init(_ body: String, _ expected: String) {
            self.body = body
            self.expected = expected
        }
    }

    @Test(
        "an answer that does not read is .unexpectedAnswer, naming the member",
        arguments: [
            Unreadable("not json", "GET /v1/tasks/tsk_a answered 200: the answer: The given data was not valid JSON"),
            Unreadable(#"["tsk_a"]"#, "the answer is not an object"),
            Unreadable(Canned.task().replacing(#""state": "running", "#, with: ""), "state is missing"),
            Unreadable(Canned.task(state: "sleeping"), "state: "),
            Unreadable(
                Canned.task().replacing(#""fraction": 0.25"#, with: #""fraction": "25%""#),
                "progress.fraction is not a number"),
            // Foundation's decoder names no member for a number that is not an integer.
            Unreadable(Canned.task().replacing(#""attempts": 2"#, with: #""attempts": 2.5"#), "answered 200: the answer"),
        ])
    func unexpectedAnswers(_ example: Unreadable) async {
        let (body, expected) = (example.body, example.expected)
        let transport = CannedTransport(["GET /v1/tasks/tsk_a": (200, body)])
        do {
            _ = try await client(transport).task("tsk_a")
            Issue.record("decoded \(body)")
        } catch {
            let error = error as APIError
            guard case .unexpectedAnswer(let what) = error else {
                Issue.record("\(error)")
                return
            }
            #expect(what.contains(expected), "\(what)")
        }
    }

    @Test("a member of a listed item is named with its index")
    func unexpectedInAList() async {
        let broken = Canned.task(id: "tsk_2").replacing(#""kind": "upload""#, with: #""kind": 7"#)
        let transport = CannedTransport([
            "GET /v1/sessions/cli/tasks?limit=500": (200, #"{"tasks": [\#(Canned.task()), \#(broken)]}"#)
        ])
        await #expect(
            throws: APIError.unexpectedAnswer("GET /v1/sessions/cli/tasks?limit=500 answered 200: tasks[1].kind is not a string")
        ) {
            try await client(transport).allTasks(session: "cli")
        }
    }

    @Test("ensureSession: created, or existing with another configuration, is fine; another refusal is not")
    func ensureSession() async throws {
        let exists = #"{"status": 409, "code": "session_exists", "detail": "the session exists with another configuration"}"#
        try await client(CannedTransport(["PUT /v1/sessions/cli": (201, Canned.session)])).ensureSession("cli")
        try await client(CannedTransport(["PUT /v1/sessions/cli": (409, exists)])).ensureSession("cli")
        let conflict = #"{"status": 409, "code": "conflict", "detail": "the session is finishing"}"#
        await #expect(throws: APIError.problem(APIProblem(status: 409, code: .conflict, detail: "the session is finishing"))) {
            try await client(CannedTransport(["PUT /v1/sessions/cli": (409, conflict)])).ensureSession("cli")
        }
    }

    @Test("new tasks go as one batch with their request, headers and options; the bearer token rides along")
    func createTasks() async throws {
        let transport = CannedTransport([
            "POST /v1/sessions/cli/tasks": (
                201, #"{"tasks": [\#(Canned.task()), \#(Canned.task(id: "tsk_d", kind: "download"))]}"#
            )
        ])
        let created = try await client(transport, token: "t0ken").createTasks(
            [
                .upload(
                    file: "/data/clip.bin", url: "https://in.example/clip.bin", method: "POST", headers: [("X-A", "1")],
                    protocol: "tus", chunkSize: 1024),
                .download(
                    url: "https://maps.example/map.tiles", destination: "/data/map.tiles", headers: [], overwrite: true,
                    sha256: "ab"),
            ], session: "cli")
        #expect(created.map(\.id) == ["tsk_a", "tsk_d"])
        let request = try #require(transport.requests.first)
        #expect(request.headers == ["Authorization: Bearer t0ken"] && request.method == "POST")
        let body = try JSON.parse(request.body ?? [])
        #expect(
            body == [
                "tasks": [
                    [
                        "file": "/data/clip.bin",
                        "request": ["url": "https://in.example/clip.bin", "method": "POST", "headers": ["X-A": "1"]],
                        "upload": ["protocol": "tus", "chunk_size": 1024],
                    ],
                    [
                        "kind": "download", "request": ["url": "https://maps.example/map.tiles"],
                        "destination": "/data/map.tiles",
                        "overwrite": true, "expected_sha256": "ab",
                    ],
                ]
            ])
    }

    @Test("sessions, attempts, network, webhooks and info decode")
    func resources() async throws {
        let attempt = """
            {"number": 2, "started_at": "2026-11-20T10:00:05Z", "ended_at": "2026-11-20T10:01:10Z", "bytes_sent": 10, "bytes_received": 0,
             "outcome": "retry", "http_status": 503, "network_type": "wifi",
             "error": {"code": -1011, "name": "bad_server_response", "message": "503", "http_status": 503}}
            """
        let network = #"{"type": "cellular", "interface": null, "expensive": true, "constrained": false, "source": "override"}"#
        let hook =
            #"{"id": "wh_1", "session_id": "cli", "url": "http://127.0.0.1:9/hooks", "events": [], "enabled": true, "disabled_reason": null, "created_at": "2026-11-20T10:00:00Z", "previous_secret_expires_at": null"#
        let info =
            #"{"listen": "127.0.0.1:8427", "finished_task_retention": 604800.0, "version": "1.1.0", "protocols": ["raw", "tus"], "task_counts": {"running": 2, "hibernating": 1}}"#
        let transport = CannedTransport([
            "GET /v1/sessions": (200, #"{"sessions": [\#(Canned.session)]}"#),
            "GET /v1/tasks/tsk_a/attempts": (200, #"{"attempts": [\#(attempt)]}"#),
            "PUT /v1/network": (200, network),
            "GET /v1/sessions/cli/webhooks": (200, #"{"webhooks": [\#(hook)}]}"#),
            "POST /v1/sessions/cli/webhooks": (201, hook + #", "secret": "whsec_abc"}"#),
            "GET /v1/info": (200, info),
        ])
        let client = client(transport)
        let sessions = try await client.sessions()
        #expect(sessions.map(\.id) == ["cli"] && sessions[0].enabled && sessions[0].taskCounts[.completed] == 7)
        #expect(sessions[0].taskCounts[.authRequired] == 0 && sessions[0].taskCounts.byState.count == TaskState.allCases.count)
        let attempts = try await client.attempts(task: "tsk_a")
        #expect(
            attempts.count == 1 && attempts[0].number == 2 && attempts[0].outcome == "retry"
                && attempts[0].error?.httpStatus == 503)
        #expect(attempts[0].endedAt == "2026-11-20T10:01:10Z" && attempts[0].bytesSent == 10 && attempts[0].networkType == "wifi")
        let state = try await client.setNetwork(NetworkOverride(type: "cellular", expensive: true))
        #expect(
            state.type == "cellular" && state.interface == nil && state.expensive && !state.constrained
                && state.source == "override")
        #expect(try JSON.parse(transport.requests.last?.body ?? []) == ["type": "cellular", "expensive": true])
        let hooks = try await client.webhooks(session: "cli")
        #expect(hooks.map(\.url) == ["http://127.0.0.1:9/hooks"] && hooks[0].secret == nil)
        #expect(try await client.addWebhook(session: "cli", url: "http://127.0.0.1:9/hooks").secret == "whsec_abc")
        let shown = try await client.info()
        #expect(shown.version == "1.1.0" && shown.protocols == ["raw", "tus"] && shown.taskCounts == TaskCounts([.running: 2]))
        #expect(shown.settings == ["listen": .string("127.0.0.1:8427"), "finished_task_retention": .number(604800)])
    }

    @Test("the event stream: task events carry their task; the last id is sent back to resume")
    func events() async throws {
        let transport = CannedTransport()
        let task = Canned.task().replacing("\n", with: " ")
        transport.streaming([
            "retry: 2000\n: connected\n\nid: 7\nevent: task.progress\ndata: {\"type\": \"task.progress\", \"da",
            "ta\": \(task)}\n\nid: 8\nevent: session.drained\ndata: {\"type\": \"session.drained\", \"data\": {\"session_id\": \"cli\", \"task_counts\": {\"completed\": 3}}}\n\n",
        ])
        var received: [APIEvent] = []
        let client = client(transport)
        for try await event in client.events(session: "cli") { received.append(event) }
        #expect(received.map(\.id) == ["7", "8"] && received.map(\.type) == ["task.progress", "session.drained"])
        #expect(received[0].task?.id == "tsk_a" && received[0].task?.progress.bytesSent == 1024 && received[1].task == nil)
        #expect(received[1].drained?.sessionID == "cli" && received[1].drained?.taskCounts[.completed] == 3)
        #expect(transport.sent == ["GET /v1/events?session=cli"])

        // Broken after it opened: the stream has ended; the next one resumes after the last event.
        transport.streaming(["id: 9\nevent: x\ndata: {}\n\n"], failure: "curl error 56: Recv failure")
        var ids: [String?] = []
        for try await event in client.events(after: "8") { ids.append(event.id) }
        #expect(ids == ["9"] && transport.requests.last?.headers.contains("Last-Event-ID: 8") == true)
        // Never opened: out of reach.
        transport.streaming([], failure: "curl error 56: Recv failure")
        await #expect(throws: APIError.transport(TransportFailure(baseURL: Self.base, reason: "curl error 56: Recv failure"))) {
            for try await _ in client.events(after: "8") {}
        }
        // Refused: the problem.
        transport.answer("GET /v1/events?session=other", 403, #"{"code": "forbidden", "detail": "not yours"}"#)
        await #expect(throws: APIError.problem(APIProblem(status: 403, code: .forbidden, detail: "not yours"))) {
            for try await _ in client.events(session: "other") {}
        }
    }
}
