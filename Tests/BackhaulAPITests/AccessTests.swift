import BackhaulAPI
import BackhaulCore
import JSONCodec
import MicroHTTP
import Testing

@Suite("Bearer tokens and scopes")
struct AccessTests {
    static let admin = "admin-token-0123456789"
    static let camera = "camera-token-0123456789"
    static let tokens = try! AccessTokens(
        parsing: """
            # who may do what
            \(admin) admin
            \(camera) client cam-* fleet.?   # two patterns
            """)

    func harness() throws -> APIHarness {
        let harness = try APIHarness(tokens: Self.tokens)
        for id in ["cam-1", "cam-2", "other"] {
            #expect(harness.call("PUT", "/v1/sessions/\(id)", ["configuration": [:]], token: Self.admin).0 == 201)
        }
        return harness
    }

    @Test("no token, a wrong one, or a malformed header: 401 with WWW-Authenticate; health stays open")
    func unauthenticated() throws {
        let harness = try harness()
        for token in [nil, "wrong-token-0123456789", Self.admin + "x", String(Self.admin.dropLast())] {
            let (status, problem, response) = harness.call("GET", "/v1/sessions", token: token)
            #expect(status == 401 && problem["code"]?.stringValue == "unauthorized")
            #expect(response.headers.contains { $0.0 == "WWW-Authenticate" })
        }
        let (status, _, _) = harness.call("GET", "/v1/sessions", raw: nil)
        #expect(status == 401)
        #expect(harness.call("GET", "/healthz").0 == 200)
    }

    @Test("a client sees its sessions only: others are 404 to read (as if absent) and 403 to change")
    func clientScope() throws {
        let harness = try harness()
        let listed = harness.call("GET", "/v1/sessions", token: Self.camera).1["sessions"]?.arrayValue?.compactMap {
            $0["id"]?.stringValue
        }
        #expect(listed == ["cam-1", "cam-2"])
        #expect(harness.call("GET", "/v1/sessions/cam-1", token: Self.camera).0 == 200)
        let hidden = harness.call("GET", "/v1/sessions/other", token: Self.camera)
        let absent = harness.call("GET", "/v1/sessions/nonexistent", token: Self.admin)
        #expect(hidden.0 == 404 && hidden.1["detail"]?.stringValue == "no session other")
        #expect(absent.0 == 404)
        #expect(harness.call("PATCH", "/v1/sessions/other", ["enabled": false], token: Self.camera).0 == 403)
        #expect(harness.call("POST", "/v1/sessions/other/tasks", harness.task(), token: Self.camera).0 == 403)
        #expect(harness.call("PUT", "/v1/sessions/fleet.1", ["configuration": [:]], token: Self.camera).0 == 201)
        #expect(harness.call("PUT", "/v1/sessions/fleet.10", ["configuration": [:]], token: Self.camera).0 == 403)
    }

    @Test("tasks and webhooks are scoped by their session")
    func tasksAndWebhooks() throws {
        let harness = try harness()
        let task = harness.call("POST", "/v1/sessions/other/tasks", harness.task(), token: Self.admin).1
        let id = try #require(task["id"]?.stringValue)
        let hidden = harness.call("GET", "/v1/tasks/\(id)", token: Self.camera)
        #expect(hidden.0 == 404 && hidden.1["detail"]?.stringValue == "no task \(id)")
        #expect(harness.call("POST", "/v1/tasks/\(id)/cancel", token: Self.camera).0 == 403)
        #expect(harness.call("PATCH", "/v1/tasks/\(id)", ["priority": 1], token: Self.camera).0 == 403)
        #expect(harness.call("GET", "/v1/tasks/\(id)", token: Self.admin).0 == 200)
        let own = harness.call("POST", "/v1/sessions/cam-1/tasks", harness.task(), token: Self.camera)
        #expect(own.0 == 201)
        let hook = harness.call("POST", "/v1/sessions/other/webhooks", ["url": "http://127.0.0.1:9/h"], token: Self.admin).1
        let hookID = try #require(hook["id"]?.stringValue)
        #expect(harness.call("GET", "/v1/webhooks/\(hookID)", token: Self.camera).0 == 404)
        #expect(harness.call("DELETE", "/v1/webhooks/\(hookID)", token: Self.camera).0 == 403)
        #expect(harness.call("GET", "/v1/webhooks/\(hookID)/deliveries", token: Self.admin).0 == 200)
    }

    @Test("network and policy changes need an admin token")
    func adminOnly() throws {
        let harness = try harness()
        for (method, path) in [
            ("PUT", "/v1/network"), ("DELETE", "/v1/network"), ("PUT", "/v1/policy"), ("DELETE", "/v1/policy"),
        ] {
            #expect(harness.call(method, path, ["type": "wifi"], token: Self.camera).0 == 403, "\(method) \(path)")
        }
        // An admin passes the check (the in-process harness has no engine, hence 503).
        #expect(harness.call("PUT", "/v1/network", ["type": "wifi"], token: Self.admin).0 == 503)
    }

    @Test(
        "token files: roles, patterns, comments; weak or malformed entries are refused",
        arguments: [
            "short admin", "long-enough-token-1 root", "long-enough-token-1 client", "long-enough-token-1 admin cam-*",
            "   # nothing",
        ])
    func invalidTokenFiles(_ text: String) {
        #expect(throws: AccessTokens.Invalid.self) { try AccessTokens(parsing: text) }
    }

    @Test("BACKHAUL_TOKENS separates entries with ';'")
    func environmentForm() throws {
        let tokens = try AccessTokens(parsing: "aaaaaaaaaaaaaaaa admin; bbbbbbbbbbbbbbbb client s1")
        #expect(tokens.principal(authorization: "Bearer aaaaaaaaaaaaaaaa") == .admin)
        #expect(tokens.principal(authorization: "bearer bbbbbbbbbbbbbbbb") == .client(["s1"]))
        #expect(tokens.principal(authorization: "Basic aaaaaaaaaaaaaaaa") == nil)
    }
}
