// What API clients send: requests through the daemon's router and handlers (over a store in
// memory), the JSON decoders on their own, the token file and Authorization headers, and the
// daemon's configuration file, flags and environment.
import BackhaulCore
import BackhaulFiles
import BackhaulSQLite
import BackhaulQueue
import Foundation
import JSONCodec
import Logging
import MicroHTTP

@testable import BackhaulAPI
@testable import BackhaulServer

let apiTarget = FuzzTarget(
    name: "api",
    surface: "API requests: method, path, query, headers, JSON bodies (tasks, batches, sessions, "
        + "policy, network, webhooks, PATCHes), bearer tokens", setUp: { _ = apiFixture.routers() }, run: runAPI)
let decodeTarget = FuzzTarget(
    name: "decode",
    surface: "the request decoders alone: task drafts, uploads, configuration, policy, network, "
        + "task PATCHes, webhook fields", run: runDecode)
let tokensTarget = FuzzTarget(name: "tokens", surface: "the token file and Authorization headers", run: runTokens)
let configTarget = FuzzTarget(
    name: "config", surface: "the configuration file, flags and environment (backhauld's settings table)", run: runConfig)

/// The admin and client tokens of the `api` target's token file (seeds use them).
let fuzzTokens = """
    fuzz-admin-token-0123456789abcdef admin
    fuzz-client-token-0123456789abcdef client s* fuzz
    """

/// Routers over a store in memory (tokens off, and on). Every 20,000 requests the store is
/// replaced by a fresh one, made on another thread beforehand (opening one can take longer than
/// an input may), so that the tasks the fuzzer creates do not fill the memory.
final class APIFixture: @unchecked Sendable {
    static let root: String = {
        let root = NSTemporaryDirectory() + "backhaul-fuzz-\(getpid())"
        try? FileManager.default.createDirectory(atPath: root + "/dir", withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: root + "/file.bin", contents: Data(repeating: 7, count: 100))
        return root
    }()

    typealias Routers = (store: Store, open: Router, guarded: Router)
    static let renewal = 20_000
    var current: Routers?
    var uses = 0
    let lock = NSLock()
    var spare: Routers?

    static func make() -> Routers {
        let store = try! Store(path: ":memory:")
        var options = APIOptions(allowedRoots: AllowedRoots([root]))
        let logger = Logger(label: "fuzz", factory: { _ in SwiftLogNoOpLogHandler() })
        let open = API(store: store, status: nil, settings: nil, options: options, logger: logger).router
        options.tokens = try! AccessTokens(parsing: fuzzTokens)
        return (store, open, API(store: store, status: nil, settings: nil, options: options, logger: logger).router)
    }

    func routers() -> (open: Router, guarded: Router) {
        uses += 1
        if uses % Self.renewal == Self.renewal / 2 {
            Thread { [self] in
                let made = Self.make()
                lock.withLock { spare = made }
            }
            .start()
        }
        if current == nil || uses % Self.renewal == 0, let next = current == nil ? Self.make() : lock.withLock({ spare }) {
            current = next
        }
        return (current!.open, current!.guarded)
    }
}

let apiFixture = APIFixture()

/// `METHOD /path?query`, header lines, an empty line, the body. `ROOT` in the path or body is the
/// allowed root (which holds `file.bin` and `dir/`).
func runAPI(_ input: FuzzInput) {
    let text = input.text.replacingOccurrences(of: "ROOT", with: APIFixture.root)
    var lines = text.lines[...]
    let requestLine = (lines.popFirst() ?? "").split(separator: " ", maxSplits: 1)
    let method = requestLine.first.map(String.init) ?? "GET"
    let target = requestLine.count > 1 ? String(requestLine[1]) : "/"
    let pathAndQuery = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
    var query: [String: String] = [:]
    if pathAndQuery.count > 1 {
        for pair in pathAndQuery[1].split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            query[String(parts[0]).removingPercentEncoding ?? String(parts[0])] =
                parts.count > 1 ? (String(parts[1]).removingPercentEncoding ?? String(parts[1])) : ""
        }
    }
    var headers: [String: String] = [:]
    while let line = lines.first, !line.isEmpty {
        lines.removeFirst()
        let pair = line.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
        let name = pair[0].lowercased()
        let value = pair.count > 1 ? String(pair[1].drop { $0 == " " }) : ""
        headers[name] = headers[name].map { $0 + ", " + value } ?? value
    }
    if !lines.isEmpty { lines.removeFirst() }
    let body = Array(lines.joined(separator: "\n").utf8)
    let path = String(pathAndQuery[0]).removingPercentEncoding ?? String(pathAndQuery[0])
    // A backup writes a file wherever its body says: not a thing to let a fuzzer do.
    guard !path.contains("backup") else { return }
    let request = HTTPRequest(method: method, path: path, query: query, headers: headers, body: body)
    let (open, guarded) = apiFixture.routers()
    let (response, _) = (headers["authorization"] == nil ? open : guarded).handle(request)
    require(response.status != 500, "\(method) \(target) answered 500: \(String(decoding: response.bodyBytes, as: UTF8.self))")
    if response.status >= 400 {
        require(
            (try? JSON.parse(response.bodyBytes, maxDepth: 64))?["code"]?.stringValue != nil,
            "\(method) \(target) answered \(response.status) without a problem code")
    }
}

/// The first line picks the decoder (task, upload, configuration, policy, network, patch, webhook);
/// the rest is its JSON.
func runDecode(_ input: FuzzInput) {
    let lines = input.text.lines
    guard let kind = lines.first, let value = try? JSON.parse(Array(lines.dropFirst().joined(separator: "\n").utf8), maxDepth: 32)
    else { return }
    let base = TransferConfiguration()
    switch kind {
    case "task":
        if let draft = try? TaskDraft.decode(value, base: base) { _ = draft }
    case "upload":
        _ = try? UploadSpec.decode(value)
    case "configuration":
        if let configuration = try? base.applying(value) { _ = configuration.json }
    case "policy":
        if let policy = try? ServicePolicy().applying(value) {
            for minute in stride(from: 0, to: 1440, by: 97) {
                _ = policy.bandwidth(minuteOfDay: minute, network: .wifi)
                _ = policy.minutesToNextEdge(minuteOfDay: minute)
            }
        }
    case "network":
        var classifier = NetworkClassifier()
        try? classifier.apply(value)
        _ = try? NetworkState.decodeOverride(value, classifier: classifier)
    case "patch":
        _ = try? TaskPatch.decode(value, session: base)
    default:
        if let reader = try? FieldReader(value) {
            _ = try? API.decodeEvents(reader)
            _ = try? API.decodeWebhookURL(reader)
            _ = try? API.decodeSecret(reader)
        }
    }
}

/// The token file up to a line `%%`, then Authorization headers, one a line.
func runTokens(_ input: FuzzInput) {
    guard let tokens = try? AccessTokens(parsing: input.section(0)) else { return }
    for header in input.section(1).lines {
        if let principal = tokens.principal(authorization: header) {
            _ = principal.canAccess(session: "s1")
        }
    }
}

/// The config file's text; after a line `%%`, flags (one a line); after another, environment
/// lines `NAME=value`.
func runConfig(_ input: FuzzInput) {
    let path = NSTemporaryDirectory() + "backhaul-fuzz-config-\(getpid()).json"
    _ = FileManager.default.createFile(atPath: path, contents: Data(input.section(0).utf8))
    var arguments = ["--config", path]
    arguments += input.section(1).lines.filter { !$0.isEmpty && !$0.hasPrefix("--config") }
    var environment: [String: String] = [:]
    for line in input.section(2).lines {
        let pair = line.split(separator: "=", maxSplits: 1)
        if pair.count == 2, pair[0] != "BACKHAUL_CONFIG" { environment[String(pair[0])] = String(pair[1]) }
    }
    _ = try? DaemonConfiguration.resolve(arguments: arguments, environment: environment, workingDirectory: "/tmp")
}
