import BackhaulAPI
import BackhaulCore
import BackhaulFiles
import BackhaulQueue
import BackhaulSQLite
import BackhaulUI
import Foundation
import JSONCodec
import Logging
import MicroHTTP
import Testing

@Suite("Dashboard files and the event stream's scope")
struct DashboardAPITests {
    static let admin = "admin-token-0123456789"
    static let camera = "camera-token-0123456789"

    func get(_ router: Router, _ path: String, headers: [String: String] = [:]) -> HTTPResponse {
        router.handle(HTTPRequest(method: "GET", path: path, headers: headers)).0
    }

    @Test("/ and /ui/{file}: types, a strong ETag with 304, CSP without inline script or style, nosniff; unknown files 404")
    func served() throws {
        let api = try APIHarness()
        var expected = ["/": "text/html", "/ui/app.css": "text/css", "/ui/icon.svg": "image/svg+xml"]
        for name in Dashboard.files.keys where name.hasSuffix(".js") { expected["/ui/\(name)"] = "text/javascript" }
        #expect(expected.count == Dashboard.files.count + 1 && expected["/ui/app.js"] != nil)
        for (path, type) in expected {
            let response = get(api.router, path)
            #expect(response.status == 200, "\(path)")
            #expect(response.header("Content-Type")?.hasPrefix(type) == true, "\(path): \(response.header("Content-Type") ?? "")")
            #expect(response.header("X-Content-Type-Options") == "nosniff")
            let policy = try #require(response.header("Content-Security-Policy"))
            #expect(
                policy.contains("default-src 'none'") && policy.contains("script-src 'self'")
                    && policy.contains("style-src 'self'"))
            #expect(policy.contains("connect-src 'self'") && policy.contains("frame-ancestors 'none'"))
            #expect(!policy.contains("unsafe"), "no unsafe-inline, no unsafe-eval")
            let etag = try #require(response.header("ETag"))
            #expect(etag.hasPrefix("\"") && etag.count == 34, "a strong validator: \(etag)")
            let again = get(api.router, path, headers: ["if-none-match": "\"other\", \(etag)"])
            #expect(again.status == 304 && again.bodyBytes.isEmpty)
            #expect(get(api.router, path, headers: ["if-none-match": "\"other\""]).status == 200)
        }
        let missing = get(api.router, "/ui/secrets.txt")
        #expect(missing.status == 404 && missing.header("Content-Type") == "application/problem+json")
        #expect(get(api.router, "/ui/../Package.swift").status == 404)
    }

    @Test("the page keeps to itself: no inline script, style or handler; nothing named on another host; under 60 KB")
    func selfContained() throws {
        let page = String(decoding: Dashboard.page.bytes, as: UTF8.self)
        let scripts = page.components(separatedBy: "<script").dropFirst()
        #expect(scripts.count == 1 && scripts.allSatisfy { $0.hasPrefix(" src=\"/ui/") }, "scripts come from /ui/ only")
        #expect(
            !page.contains("<style") && !page.contains(" style=")
                && page.range(of: #" on[a-z]+="#, options: .regularExpression) == nil)
        for asset in [Dashboard.page] + Array(Dashboard.files.values) {
            var text = String(decoding: asset.bytes, as: UTF8.self)
            text = text.replacingOccurrences(of: "xmlns=\"http://www.w3.org/2000/svg\"", with: "")
            #expect(
                !text.contains("http://") && !text.contains("https://") && !text.contains("//cdn"),
                "\(asset.name) names another host")
            #expect(!text.contains("eval(") && !text.contains("innerHTML"), "\(asset.name) builds no code or markup from strings")
        }
        print(
            "dashboard: \(Dashboard.totalBytes) bytes in all (\(Dashboard.files.map { "\($0.key) \($0.value.bytes.count)" }.sorted().joined(separator: ", ")), index.html \(Dashboard.page.bytes.count))"
        )
        #expect(Dashboard.totalBytes < 60_000)
    }

    @Test("the script is ES modules: the page loads app.js; what it imports, and so on, is every script served")
    func modules() throws {
        let page = String(decoding: Dashboard.page.bytes, as: UTF8.self)
        #expect(page.contains(#"<script src="/ui/app.js" type="module"></script>"#))
        /// The files a module imports: `import { … } from './view.js';` names view.js.
        func imports(_ name: String) -> [String] {
            let text = String(decoding: Dashboard.files[name]?.bytes ?? [], as: UTF8.self)
            let tails = text.components(separatedBy: "from './").dropFirst()
            return tails.compactMap { $0.split(separator: "'").first.map(String.init) }
        }
        var reached: Set<String> = []
        var next = ["app.js"]
        while let name = next.popLast() {
            guard reached.insert(name).inserted else { continue }
            #expect(Dashboard.files[name] != nil, "\(name) is imported but not served")
            next += imports(name)
        }
        #expect(reached == Set(Dashboard.files.keys.filter { $0.hasSuffix(".js") }), "every script served is imported")
    }

    @Test("--no-ui: the dashboard's routes are gone; the API is untouched")
    func switchedOff() throws {
        let store = try Store(path: ":memory:")
        var options = APIOptions(allowedRoots: AllowedRoots(["/tmp"]))
        options.dashboard = false
        let router = API(store: store, status: nil, settings: nil, options: options, logger: Logger(label: "test")).router
        #expect(get(router, "/").status == 404)
        #expect(get(router, "/ui/app.js").status == 404)
        #expect(get(router, "/healthz").status == 200)
        #expect(!router.routes.contains { $0.pattern == "/" || $0.pattern.hasPrefix("/ui/") })
    }

    @Test("with tokens the page itself is open (it holds no data), and the API behind it still asks")
    func openPageClosedAPI() throws {
        let api = try APIHarness(tokens: try AccessTokens(parsing: "\(Self.admin) admin"))
        #expect(get(api.router, "/").status == 200)
        #expect(get(api.router, "/ui/app.js").status == 200)
        #expect(get(api.router, "/v1/sessions").status == 401)
    }

    /// Reads a stream until `done` holds for what arrived, or `reads` calls were made.
    func read(_ response: HTTPResponse, reads: Int = 20, until done: (String) -> Bool) -> String {
        guard case .stream(let stream) = response.body else { return "" }
        var text = ""
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        for _ in 0..<reads where !done(text) {
            let chunk = buffer.withUnsafeMutableBytes { stream.read(into: $0) }
            guard case .bytes(let count) = chunk else { break }
            text += String(decoding: buffer[0..<count], as: UTF8.self)
        }
        return text
    }

    @Test("GET /v1/events with a client token and no session streams that client's sessions only; another session is 403")
    func clientStreamsItsOwnSessions() throws {
        let root = NSTemporaryDirectory() + "backhaul-dash-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        _ = FileManager.default.createFile(atPath: root + "/f", contents: Data(repeating: 1, count: 10))
        let store = try Store(path: ":memory:")
        var options = APIOptions(allowedRoots: AllowedRoots([root]))
        options.tokens = try AccessTokens(parsing: "\(Self.admin) admin\n\(Self.camera) client cam-*")
        let router = API(
            store: store, status: nil, settings: nil, eventFeed: EventFeed(), options: options, logger: Logger(label: "test")
        ).router
        func call(_ method: String, _ path: String, _ body: JSON? = nil, token: String = Self.admin) -> (Int, JSON) {
            let request = HTTPRequest(
                method: method, path: path, headers: ["authorization": "Bearer \(token)"],
                body: body?.serializedBytes() ?? [])
            let response = router.handle(request).0
            return (response.status, (try? JSON.parse(response.bodyBytes)) ?? .null)
        }
        // Events in order: one of dog-1 (not the client's), then one of cam-1.
        var ids: [String: String] = [:]
        for session in ["dog-1", "cam-1"] {
            #expect(call("PUT", "/v1/sessions/\(session)", ["configuration": [:]]).0 == 201)
            let task = call(
                "POST", "/v1/sessions/\(session)/tasks",
                ["file": .string(root + "/f"), "request": ["url": "http://127.0.0.1:9/x"]])
            ids[session] = task.1["id"]?.stringValue
            #expect(call("POST", "/v1/tasks/\(ids[session] ?? "")/cancel").0 == 200)
        }
        let (dog, cam) = (try #require(ids["dog-1"]), try #require(ids["cam-1"]))

        let stream = router.handle(
            HTTPRequest(
                method: "GET", path: "/v1/events", query: ["after": "0"],
                headers: ["authorization": "Bearer \(Self.camera)"])
        ).0
        #expect(stream.status == 200 && stream.header("Content-Type") == "text/event-stream")
        let text = read(stream) { $0.contains(cam) }
        #expect(text.contains(cam), "the client's own event arrives: \(text)")
        #expect(!text.contains(dog), "another session's event does not: \(text)")

        let everything = router.handle(
            HTTPRequest(
                method: "GET", path: "/v1/events", query: ["after": "0"],
                headers: ["authorization": "Bearer \(Self.admin)"])
        ).0
        let all = read(everything) { $0.contains(cam) }
        #expect(all.contains(dog) && all.contains(cam), "an admin sees both")

        let other = router.handle(
            HTTPRequest(
                method: "GET", path: "/v1/events", query: ["session": "dog-1"],
                headers: ["authorization": "Bearer \(Self.camera)"])
        ).0
        #expect(other.status == 403)
    }
}
