import BackhaulAPI
import BackhaulCore
import BackhaulFiles
import BackhaulQueue
import BackhaulSQLite
import Foundation
import JSONCodec
import Logging
import MicroHTTP
import Testing

/// The router in process: no socket, a fresh in-memory store per test.
final class APIHarness {
    let root: String
    let store: Store
    let router: Router

    init(tokens: AccessTokens? = nil) throws {
        root = NSTemporaryDirectory() + "backhaul-api-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: root + "/dir", withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: root + "/file.bin", contents: Data(repeating: 7, count: 100))
        store = try Store(path: ":memory:")
        var options = APIOptions(allowedRoots: AllowedRoots([root]))
        options.tokens = tokens
        router = API(store: store, status: nil, settings: nil, options: options, logger: Logger(label: "test")).router
    }

    deinit { try? FileManager.default.removeItem(atPath: root) }

    func call(
        _ method: String, _ path: String, _ body: JSON? = nil, raw: String? = nil, query: [String: String] = [:],
        token: String? = nil
    ) -> (Int, JSON, HTTPResponse) {
        let bytes = raw.map { Array($0.utf8) } ?? body?.serializedBytes() ?? []
        let headers = token.map { ["authorization": "Bearer \($0)"] } ?? [:]
        let (response, _) = router.handle(HTTPRequest(method: method, path: path, query: query, headers: headers, body: bytes))
        return (response.status, (try? JSON.parse(response.bodyBytes, maxDepth: 64)) ?? .null, response)
    }

    var file: String { root + "/file.bin" }

    func task(_ overrides: JSONObject = [:]) -> JSON {
        var object: JSONObject = ["file": .string(file), "request": ["url": "http://127.0.0.1:9/x"]]
        for (key, value) in overrides { object[key] = value }
        return .object(object)
    }
}

@Suite("API in process")
struct APITests {
    let api: APIHarness

    init() throws {
        api = try APIHarness()
        _ = api.call("PUT", "/v1/sessions/s", ["configuration": [:]])
    }

    /// Each bad input, its status and its stable code.
    static let badTasks: [(String, JSONObject, Int, String)] = [
        ("not absolute", ["file": "relative/file.bin"], 422, "validation_failed"),
        ("missing file", ["file": "/nonexistent/x"], 403, "file_outside_allowed_roots"),
        ("no such file in root", ["file": "ROOT/missing.bin"], 422, "file_not_found"),
        ("directory", ["file": "ROOT/dir"], 422, "file_is_directory"),
        ("outside roots", ["file": "/etc/hostname"], 403, "file_outside_allowed_roots"),
        ("dot-dot escape", ["file": "ROOT/dir/../../../etc/hostname"], 403, "file_outside_allowed_roots"),
        ("symlink escape", ["file": "ROOT/link"], 403, "file_outside_allowed_roots"),
        ("fifo", ["file": "ROOT/fifo"], 422, "file_not_regular"),
        ("bad url", ["request": ["url": "ftp://h/x"]], 422, "validation_failed"),
        ("no url", ["request": [:]], 422, "validation_failed"),
        ("bad method", ["request": ["url": "http://h/", "method": "DELETE"]], 422, "validation_failed"),
        ("reserved header", ["request": ["url": "http://h/", "headers": ["Content-Length": "5"]]], 422, "validation_failed"),
        ("header injection", ["request": ["url": "http://h/", "headers": ["X-A": "a\nb"]]], 422, "validation_failed"),
        ("unknown protocol", ["upload": ["protocol": "ftp"]], 422, "validation_failed"),
        ("priority range", ["priority": 1.5], 422, "validation_failed"),
        ("priority type", ["priority": "high"], 422, "validation_failed"),
        ("bad date", ["earliest_begin_at": "tomorrow"], 422, "validation_failed"),
        ("unknown field", ["colour": "blue"], 422, "validation_failed"),
        ("bad configuration", ["configuration": ["max_connections_per_host": -1]], 422, "validation_failed"),
        ("fields on raw", ["upload": ["protocol": "raw", "fields": ["a": "b"]]], 422, "validation_failed"),
        ("interop_version on raw", ["upload": ["protocol": "raw", "interop_version": 6]], 422, "validation_failed"),
        ("interop_version not spoken", ["upload": ["protocol": "ietf", "interop_version": 4]], 422, "validation_failed"),
        ("interop_version as text", ["upload": ["protocol": "auto", "interop_version": "6"]], 422, "validation_failed"),
        ("chunk_size on ietf", ["upload": ["protocol": "ietf", "chunk_size": 1_048_576]], 422, "validation_failed"),
    ]

    @Test("every bad task input answers problem+json with its code", arguments: badTasks.indices)
    func badTask(_ index: Int) throws {
        let (name, overrides, status, code) = Self.badTasks[index]
        symlink("/etc/hostname", api.root + "/link")
        mkfifo(api.root + "/fifo", 0o600)
        var patched = JSONObject()
        for (key, value) in overrides {
            if case .string(let text) = value {
                patched[key] = .string(text.replacingOccurrences(of: "ROOT", with: api.root))
            } else {
                patched[key] = value
            }
        }
        let (got, body, response) = api.call("POST", "/v1/sessions/s/tasks", api.task(patched))
        #expect(got == status, "\(name): \(body.serialized())")
        #expect(body["code"]?.stringValue == code, "\(name)")
        #expect(body["status"]?.intValue == Int64(status))
        #expect(body["title"]?.stringValue?.isEmpty == false)
        #expect(body["detail"]?.stringValue?.isEmpty == false)
        #expect(response.header("Content-Type") == "application/problem+json")
    }

    @Test("ietf and auto are accepted and shown with what the server has not told yet; /v1/info lists them")
    func ietfAndAuto() throws {
        let (status, ietf, _) = api.call(
            "POST", "/v1/sessions/s/tasks", api.task(["upload": ["protocol": "ietf", "interop_version": 5]]))
        #expect(status == 201, "\(ietf.serialized())")
        #expect(ietf["upload"] == ["protocol": "ietf", "interop_version": 5, "interop_version_selected": .null])
        let (_, auto, _) = api.call("POST", "/v1/sessions/s/tasks", api.task(["upload": ["protocol": "auto"]]))
        #expect(
            auto["upload"] == [
                "protocol": "auto", "interop_version": .null, "chunk_size": 8_388_608, "protocol_selected": .null,
                "protocol_fallback": .null, "interop_version_selected": .null,
            ])
        let protocols = api.call("GET", "/v1/info").1["protocols"]?.arrayValue?.compactMap(\.stringValue) ?? []
        #expect(protocols.contains("ietf") && protocols.contains("auto"))
    }

    @Test("malformed JSON is invalid_json; deep nesting too")
    func invalidJSON() {
        for raw in ["{", "[1,]", "{'a':1}", "", String(repeating: "[", count: 100) + String(repeating: "]", count: 100)] {
            let (status, body, _) = api.call("POST", "/v1/sessions/s/tasks", raw: raw)
            #expect(status == 400, "\(raw.prefix(10))")
            #expect(body["code"]?.stringValue == "invalid_json")
        }
    }

    /// The file cases of `badTasks` given under the root, where the good file of the batch is.
    static let badFilesBesideAGoodOne = badTasks.indices.filter {
        badTasks[$0].1["file"]?.stringValue?.hasPrefix("ROOT/") == true
    }

    @Test(
        "a bad file in a batch, after a good one from the same directory, gets the code it gets alone",
        arguments: badFilesBesideAGoodOne)
    func badFileInBatch(_ index: Int) throws {
        let (name, overrides, status, code) = Self.badTasks[index]
        symlink("/etc/hostname", api.root + "/link")
        mkfifo(api.root + "/fifo", 0o600)
        let file = try #require(overrides["file"]?.stringValue).replacingOccurrences(of: "ROOT", with: api.root)
        let (got, body, _) = api.call("POST", "/v1/sessions/s/tasks", ["tasks": [api.task(), api.task(["file": .string(file)])]])
        #expect(got == status, "\(name): \(body.serialized())")
        #expect(body["code"]?.stringValue == code, "\(name)")
        #expect(body["field"]?.stringValue == "tasks[1].file", "\(name)")
    }

    @Test("a batch's files through a linked directory are kept by their resolved path; a link out of the roots is refused")
    func batchThroughLinkedDirectory() throws {
        symlink(api.root + "/dir", api.root + "/dirlink")
        symlink("/etc", api.root + "/outlink")
        for name in ["a.bin", "b.bin"] {
            _ = FileManager.default.createFile(atPath: api.root + "/dir/" + name, contents: Data([1, 2]))
        }
        let resolvedRoot = try #require(AllowedRoots.realPath(api.root))
        let (created, batch, _) = api.call(
            "POST", "/v1/sessions/s/tasks",
            [
                "tasks": [
                    api.task(["file": .string(api.root + "/dirlink/a.bin")]),
                    api.task(["file": .string(api.root + "/dirlink/b.bin")]),
                ]
            ])
        #expect(created == 201, "\(batch.serialized())")
        #expect(
            batch["tasks"]?.arrayValue?.compactMap { $0["file"]?["path"]?.stringValue }
                == [resolvedRoot + "/dir/a.bin", resolvedRoot + "/dir/b.bin"], "\(batch.serialized())")
        let (refused, problem, _) = api.call(
            "POST", "/v1/sessions/s/tasks",
            [
                "tasks": [
                    api.task(["file": .string(api.root + "/dirlink/a.bin")]),
                    api.task(["file": .string(api.root + "/outlink/hostname")]),
                ]
            ])
        #expect(refused == 403 && problem["code"]?.stringValue == "file_outside_allowed_roots", "\(problem.serialized())")
        #expect(problem["field"]?.stringValue == "tasks[1].file")
    }

    @Test("a batch is validated all-or-nothing and names the failing index")
    func batchValidation() {
        let (status, body, _) = api.call("POST", "/v1/sessions/s/tasks", ["tasks": [api.task(), api.task(["priority": 7])]])
        #expect(status == 422)
        #expect(body["field"]?.stringValue == "tasks[1].priority")
        #expect(api.call("GET", "/v1/sessions/s/tasks").1["tasks"]?.arrayValue?.isEmpty == true)
        let (created, batch, _) = api.call("POST", "/v1/sessions/s/tasks", ["tasks": [api.task(), api.task()]])
        #expect(created == 201)
        #expect(batch["tasks"]?.arrayValue?.count == 2)
    }

    /// A batch goes to the store a part at a time while the rest is validated: a task that fails
    /// in a late part must still leave nothing behind, and the answer lists every task in order.
    @Test("a batch of many parts: a failure in a late part stores nothing; the answer keeps the order and the keys")
    func batchInParts() {
        var tasks = (0..<250).map { api.task(["description": .string("n\($0)")]) }
        tasks[230] = api.task(["priority": 7])
        let (status, body, _) = api.call("POST", "/v1/sessions/s/tasks", ["tasks": .array(tasks)])
        #expect(status == 422)
        #expect(body["field"]?.stringValue == "tasks[230].priority")
        #expect(api.call("GET", "/v1/sessions/s/tasks").1["tasks"]?.arrayValue?.isEmpty == true)
        tasks[230] = api.task(["description": "n230", "idempotency_key": "k"])
        tasks[5] = api.task(["description": "n5", "idempotency_key": "k"])
        let (created, batch, _) = api.call("POST", "/v1/sessions/s/tasks", ["tasks": .array(tasks)])
        #expect(created == 201)
        let answered = batch["tasks"]?.arrayValue ?? []
        #expect(answered.map { $0["description"]?.stringValue ?? "" } == (0..<250).map { $0 == 230 ? "n5" : "n\($0)" })
        #expect(answered.count == 250 && answered[230]["id"] == answered[5]["id"])
        #expect(api.call("GET", "/v1/sessions/s").1["task_counts"]?["queued"] == .int(249))
    }

    /// Into a disabled session a batch's tasks are created waiting, each with a `task.waiting`
    /// event whose data is the task's JSON: the API renders it once for the event and its answer.
    /// The answer and the events agree, in parts, for a task its idempotency key names (no new
    /// event), and for one a quota refuses (cancelled, rendered by the writer: no waiting event).
    @Test("a batch into a disabled session: the answer's tasks are the waiting events' data")
    func batchIntoDisabledSession() throws {
        #expect(api.call("PATCH", "/v1/sessions/s", ["enabled": false]).0 == 200)
        let first = api.call("POST", "/v1/sessions/s/tasks", api.task(["idempotency_key": "k"])).1
        var tasks = (0..<150).map { api.task(["description": .string("n\($0)")]) }
        tasks[120] = api.task(["idempotency_key": "k"])
        let (status, body, _) = api.call("POST", "/v1/sessions/s/tasks", ["tasks": .array(tasks)])
        #expect(status == 201)
        let answered = body["tasks"]?.arrayValue ?? []
        #expect(answered.count == 150)
        #expect(answered[120] == first)
        let events = try api.store.events(after: 0, session: "s")
        #expect(events.count == 150)
        #expect(events.allSatisfy { $0.type == "task.waiting" })
        let byTask = Dictionary(uniqueKeysWithValues: events.map { ($0.taskID ?? "", $0.dataText) })
        for task in answered {
            #expect(task["state"]?.stringValue == "waiting" && task["waiting_reason"]?.stringValue == "session_disabled")
            let data = try #require(byTask[task["id"]?.stringValue ?? ""])
            #expect(try JSON.parse(Array(data.utf8), maxDepth: 64) == task)
        }
        // A quota that cannot hold the file: the task ends cancelled, and its event says so.
        #expect(api.call("PATCH", "/v1/sessions/s", ["configuration": ["quota_bytes": 1]]).0 == 200)
        let refused = try #require(
            api.call("POST", "/v1/sessions/s/tasks", ["tasks": [api.task()]]).1["tasks"]?.arrayValue?.first)
        #expect(refused["state"]?.stringValue == "cancelled")
        let last = try #require(try api.store.events(after: 0, session: "s").last)
        #expect(last.type == "task.cancelled")
        #expect(try JSON.parse(Array(last.dataText.utf8), maxDepth: 64) == refused)
    }

    @Test("a webhook secret that is not canonical base64 is refused with 422, naming the field")
    func malformedSecret() {
        #expect(api.call("PUT", "/v1/sessions/s", ["configuration": [:]]).0 == 200)
        let url = "http://127.0.0.1:9/hook"
        let valid = "whsec_QUJDREVGR0hJSktMTU5PUA=="
        for secret in [
            "whsec_QUJD=REVGR0hJSktMTU5PUA==", "whsec_QUJDREVGR0hJSktMTU5PUA=", "whsec_QUJDREVGR0hJSktMTU5PUB==", valid,
        ] {
            let (status, body, _) = api.call("POST", "/v1/sessions/s/webhooks", ["url": .string(url), "secret": .string(secret)])
            if secret == valid {
                #expect(status == 201, "\(secret): \(body.serialized())")
            } else {
                #expect(status == 422 && body["field"]?.stringValue == "secret", "\(secret): \(status) \(body.serialized())")
            }
        }
    }

    @Test("sessions: ids, PUT semantics, 404, 405")
    func sessions() {
        #expect(api.call("PUT", "/v1/sessions/s", ["configuration": [:]]).0 == 200)
        let (conflict, body, _) = api.call("PUT", "/v1/sessions/s", ["configuration": ["discretionary": true]])
        #expect(conflict == 409)
        #expect(body["code"]?.stringValue == "session_exists")
        #expect(api.call("PUT", "/v1/sessions/bad%20id", ["configuration": [:]]).0 == 422)
        #expect(api.call("PUT", "/v1/sessions/" + String(repeating: "a", count: 129), [:]).0 == 422)
        #expect(api.call("GET", "/v1/sessions/nope").1["code"]?.stringValue == "not_found")
        #expect(api.call("POST", "/v1/sessions/nope/tasks", api.task()).0 == 404)
        let (methodStatus, methodBody, response) = api.call("POST", "/v1/sessions/s")
        #expect(methodStatus == 405)
        #expect(methodBody["code"]?.stringValue == "method_not_allowed")
        #expect(response.header("Allow")?.contains("PUT") == true)
        #expect(api.call("GET", "/v2/nothing").0 == 404)
        let (patched, session, _) = api.call("PATCH", "/v1/sessions/s", ["configuration": ["allows_cellular_access": false]])
        #expect(patched == 200)
        #expect(session["configuration"]?["allows_cellular_access"] == .bool(false))
        #expect(session["configuration"]?["max_connections_per_host"] == .int(6))
    }

    @Test("idempotency key: the retried POST answers 200 with the first task")
    func idempotency() {
        let first = api.call("POST", "/v1/sessions/s/tasks", api.task(["idempotency_key": "cam3-clip42"]))
        let second = api.call("POST", "/v1/sessions/s/tasks", api.task(["idempotency_key": "cam3-clip42"]))
        #expect(first.0 == 201)
        #expect(second.0 == 200)
        #expect(first.1["id"] == second.1["id"])
    }

    @Test("list: state filter, limit, cursor; bad values refused")
    func listing() {
        for _ in 0..<5 { _ = api.call("POST", "/v1/sessions/s/tasks", api.task()) }
        let (_, page, _) = api.call("GET", "/v1/sessions/s/tasks", query: ["limit": "2"])
        #expect(page["tasks"]?.arrayValue?.count == 2)
        let cursor = page["next_cursor"]?.stringValue ?? ""
        let (_, next, _) = api.call("GET", "/v1/sessions/s/tasks", query: ["limit": "10", "cursor": cursor])
        #expect(next["tasks"]?.arrayValue?.count == 3)
        #expect(next["next_cursor"] == .null)
        #expect(api.call("GET", "/v1/sessions/s/tasks", query: ["state": "queued"]).1["tasks"]?.arrayValue?.count == 5)
        #expect(api.call("GET", "/v1/sessions/s/tasks", query: ["state": "done"]).0 == 422)
        #expect(api.call("GET", "/v1/sessions/s/tasks", query: ["limit": "0"]).0 == 422)
        #expect(api.call("GET", "/v1/sessions/s/tasks", query: ["cursor": "zz"]).0 == 422)
    }

    @Test("PATCH a task: priority, headers merged and removed, configuration; finished tasks refuse")
    func patchTask() throws {
        let (_, created, _) = api.call(
            "POST", "/v1/sessions/s/tasks",
            api.task(["request": ["url": "http://h/x", "headers": ["X-A": "1", "X-Token": "t"]]]))
        let id = try #require(created["id"]?.stringValue)
        let (status, patched, _) = api.call(
            "PATCH", "/v1/tasks/\(id)",
            [
                "priority": 0.9, "request": ["headers": ["X-A": .null, "X-B": "2"]], "configuration": ["discretionary": true],
            ])
        #expect(status == 200)
        #expect(patched["priority"] == .double(0.9))
        #expect(patched["request"]?["headers"] == ["X-Token": "[redacted]", "X-B": "2"])
        #expect(patched["configuration"]?["discretionary"] == .bool(true))
        #expect(api.call("PATCH", "/v1/tasks/\(id)", ["priority": 2]).0 == 422)
        #expect(api.call("POST", "/v1/tasks/\(id)/cancel").0 == 200)
        let (refused, body, _) = api.call("PATCH", "/v1/tasks/\(id)", ["priority": 0.1])
        #expect(refused == 409)
        #expect(body["code"]?.stringValue == "conflict")
        #expect(api.call("DELETE", "/v1/tasks/\(id)").0 == 204)
        #expect(api.call("GET", "/v1/tasks/\(id)").0 == 404)
    }

    @Test("an unfinished task's record cannot be deleted")
    func deleteUnfinished() throws {
        let id = try #require(api.call("POST", "/v1/sessions/s/tasks", api.task()).1["id"]?.stringValue)
        #expect(api.call("DELETE", "/v1/tasks/\(id)").0 == 409)
    }

    @Test("secrets are redacted in every answer")
    func redaction() throws {
        _ = api.call("PUT", "/v1/sessions/r", ["configuration": ["default_headers": ["Authorization": "Bearer SESSIONSECRET"]]])
        let (_, task, _) = api.call(
            "POST", "/v1/sessions/r/tasks",
            api.task([
                "request": [
                    "url": "http://h/x",
                    "headers": [
                        "Authorization": "Bearer TASKSECRET", "Cookie": "c=COOKIESECRET",
                        "X-Api-Key": "KEYSECRET",
                    ],
                ],
                "configuration": ["default_headers": ["X-Session-Token": "OVERRIDESECRET"]],
            ]))
        let id = try #require(task["id"]?.stringValue)
        let answers = [
            task.serialized(), api.call("GET", "/v1/tasks/\(id)").1.serialized(),
            api.call("GET", "/v1/sessions/r/tasks").1.serialized(), api.call("GET", "/v1/sessions/r").1.serialized(),
            api.call("GET", "/v1/sessions").1.serialized(),
        ]
        for answer in answers {
            for secret in ["SESSIONSECRET", "TASKSECRET", "COOKIESECRET", "KEYSECRET", "OVERRIDESECRET"] {
                #expect(!answer.contains(secret), "\(secret) leaked")
            }
        }
    }
}

@Suite("API in process: a session's signer")
struct SignerAPITests {
    @Test("the secret is answered by the PUT or PATCH that sets the signer, never by GET; a patch without it keeps it")
    func secretOnce() throws {
        let api = try APIHarness()
        let (created, body, _) = api.call(
            "PUT", "/v1/sessions/s", ["configuration": ["signer": ["url": "http://127.0.0.1:9/sign"]]])
        #expect(created == 201)
        let secret = try #require(body["configuration"]?["signer"]?["secret"]?.stringValue)
        #expect(WebhookRecord.key(of: secret) != nil)
        let (_, shown, _) = api.call("GET", "/v1/sessions/s")
        #expect(shown["configuration"]?["signer"] == ["url": "http://127.0.0.1:9/sign"])
        let (_, patched, _) = api.call("PATCH", "/v1/sessions/s", ["configuration": ["discretionary": true]])
        #expect(patched["configuration"]?["signer"] == ["url": "http://127.0.0.1:9/sign"], "no secret shown again")
        let (_, renewed, _) = api.call(
            "PATCH", "/v1/sessions/s", ["configuration": ["signer": ["url": "http://127.0.0.1:9/new"]]])
        let second = try #require(renewed["configuration"]?["signer"]?["secret"]?.stringValue)
        #expect(second != secret, "naming the signer again gives a new secret")
        let (given, mine, _) = api.call(
            "PUT", "/v1/sessions/t",
            ["configuration": ["signer": ["url": "http://127.0.0.1:9/s", "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]]])
        #expect(given == 201 && mine["configuration"]?["signer"]?["secret"] == "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        let (bad, problem, _) = api.call("PUT", "/v1/sessions/u", ["configuration": ["signer": ["url": "not a url"]]])
        #expect(bad == 422 && problem["code"] == "validation_failed")
    }
}
