import ArgumentParser
import BackhaulCore
import FoundationEssentials
import Glibc
import JSONCodec

/// `backhaul`: the command-line client of backhauld.
public struct Backhaul: ParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "backhaul",
        abstract: "Hand uploads to backhauld and follow them.",
        discussion: """
            The daemon's address and token come from --url and --token or BACKHAUL_URL and BACKHAUL_TOKEN.
            Exit codes: 0 done, 1 the API refused, 3 a waited-for task failed or was cancelled,
            4 the daemon cannot be reached, 64 bad usage.
            """,
        subcommands: [Upload.self, Download.self, List.self, Show.self, Cancel.self, Suspend.self, Resume.self, Sessions.self, Network.self,
                      Webhooks.self, Watch.self])

    public init() {}
}

/// Where the daemon is, and how to print.
struct Connection: ParsableArguments {
    @Option(help: "The daemon's URL (default: BACKHAUL_URL or http://127.0.0.1:8427).")
    var url: String?

    @Option(help: "A bearer token (default: BACKHAUL_TOKEN).")
    var token: String?

    @Flag(help: "Print JSON instead of tables, for scripts.")
    var json = false

    func client() throws -> APIClient {
        let environment = ProcessInfo.processInfo.environment
        return try APIClient(url: url ?? environment["BACKHAUL_URL"] ?? "http://127.0.0.1:8427",
                             token: token ?? environment["BACKHAUL_TOKEN"])
    }
}

/// Runs a command body, turning a `CLIError` into its message and exit status.
func running(_ body: () throws -> Void) throws {
    do {
        try body()
    } catch let error as CLIError {
        let message = Array("backhaul: \(error.description)\n".utf8)
        _ = message.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
        throw ExitCode(error.status.rawValue)
    }
}

func emit(_ text: String) { print(text) }

struct Upload: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Upload files in the background.")

    @OptionGroup var connection: Connection

    @Argument(help: "Files to upload (absolute or relative paths inside the daemon's allowed roots).")
    var files: [String]

    @Option(help: "Destination URL; {name} is replaced by the file's name, and a URL ending in / gets it appended.")
    var to: String

    @Option(name: .customLong("protocol"),
            help: "raw, multipart, chunked, tus, s3, ietf (IETF resumable uploads) or auto (ask the server: ietf, else tus, else raw; recommended when the server is unknown).")
    var protocolName = "raw"

    @Option(help: "ietf and auto: the draft interop version to speak (3, 5 or 6; default: the newest the server takes).")
    var interopVersion: Int?

    @Option(help: "HTTP method of the upload.")
    var method: String?

    @Option(help: "Chunk or part size in bytes (chunked, tus, s3).")
    var chunkSize: Int?

    @OptionGroup var submission: Submission

    mutating func run() throws {
        try running {
            var tasks: [JSON] = []
            for file in files {
                let path = file.hasPrefix("/") ? file : FileManager.default.currentDirectoryPath + "/" + file
                let name = URL(fileURLWithPath: path).lastPathComponent
                let url = to.contains("{name}") ? to.replacing("{name}", with: name) : to.hasSuffix("/") ? to + name : to
                var request: JSONObject = ["url": .string(url)]
                if let method { request["method"] = .string(method) } else if protocolName == "tus" || protocolName == "multipart" {
                    request["method"] = "POST"
                }
                try submission.addHeaders(to: &request)
                var upload: JSONObject = ["protocol": .string(protocolName)]
                if let chunkSize { upload["chunk_size"] = .int(Int64(chunkSize)) }
                if let interopVersion { upload["interop_version"] = .int(Int64(interopVersion)) }
                tasks.append(["file": .string(path), "request": .object(request), "upload": .object(upload)])
            }
            try submission.submit(tasks, connection: connection)
        }
    }
}

/// What the commands that hand tasks over share: the session, request headers, and waiting for
/// the outcome.
struct Submission: ParsableArguments {
    @Option(help: "The session the tasks belong to (created when missing).")
    var session = "cli"

    @Option(name: .customLong("header"), help: "A request header, Name: value (repeatable).")
    var headers: [String] = []

    @Flag(help: "Wait until every task has ended; exit 3 if any failed or was cancelled.")
    var wait = false

    @Option(help: "With --wait, give up after this many seconds (exit 3).")
    var timeout: Double = 86_400

    /// Adds the `Name: value` options to a task's `request` as its `headers` object.
    func addHeaders(to request: inout JSONObject) throws(CLIError) {
        var object = JSONObject()
        for header in headers {
            guard let colon = header.firstIndex(of: ":") else {
                throw CLIError(status: .usage, description: "a header is Name: value, not \(header)")
            }
            object[String(header[..<colon])] = .string(header[header.index(after: colon)...].trimmed())
        }
        if !object.isEmpty { request["headers"] = .object(object) }
    }

    /// Creates the tasks in one batch (the session first, when missing), waits for them with
    /// `--wait`, and prints them; exit 3 when a waited-for task did not complete.
    func submit(_ tasks: [JSON], connection: Connection) throws {
        let client = try connection.client()
        try ensureSession(client, session)
        let created = try client.call("POST", "/v1/sessions/\(session)/tasks", ["tasks": .array(tasks)])
        var results = created["tasks"]?.arrayValue ?? []
        if wait {
            results = try waitForAll(client, results.compactMap { $0["id"]?.stringValue }, timeout: timeout)
        }
        if connection.json {
            emit(JSON.array(results).serialized())
        } else {
            emit(Format.table(["ID", "STATE", "DONE", "SIZE", "URL"], results.map(Format.taskRow)))
        }
        if wait, results.contains(where: { $0["state"]?.stringValue != "completed" }) {
            throw CLIError(status: .taskUnsuccessful, description: "not every task completed")
        }
    }
}

struct Download: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Download a URL in the background.")

    @OptionGroup var connection: Connection

    @Argument(help: "The URL to fetch (GET).")
    var url: String

    @Option(help: "Where the file goes (inside the daemon's allowed roots; its directory must exist). A path ending in / gets the URL's last segment.")
    var to: String

    @Option(help: "The SHA-256 the file must have (hex); checked before it is put in place.")
    var sha256: String?

    @Flag(help: "Replace a file already at the destination.")
    var overwrite = false

    @OptionGroup var submission: Submission

    mutating func run() throws {
        try running {
            var path = to.hasPrefix("/") ? to : FileManager.default.currentDirectoryPath + "/" + to
            if path.hasSuffix("/") {
                let name = URL(string: url)?.lastPathComponent ?? ""
                guard !name.isEmpty, name != "/" else {
                    throw CLIError(status: .usage, description: "the URL has no file name: give --to a file path")
                }
                path += name
            }
            var request: JSONObject = ["url": .string(url)]
            try submission.addHeaders(to: &request)
            var task: JSONObject = ["kind": "download", "request": .object(request), "destination": .string(path)]
            if overwrite { task["overwrite"] = true }
            if let sha256 { task["expected_sha256"] = .string(sha256) }
            try submission.submit([.object(task)], connection: connection)
        }
    }
}

/// PUT the session with the default configuration; an existing one (of any configuration) is fine.
func ensureSession(_ client: APIClient, _ id: String) throws(CLIError) {
    do {
        try client.call("PUT", "/v1/sessions/\(id)", ["configuration": [:]])
    } catch let error where error.description.contains("session_exists") {
        return
    }
}

/// Polls until every task is final (or the timeout passes); returns the tasks as last seen.
func waitForAll(_ client: APIClient, _ ids: [String], timeout: Double) throws(CLIError) -> [JSON] {
    let deadline = Date().addingTimeInterval(timeout)
    var latest: [String: JSON] = [:]
    while true {
        for id in ids where !isFinal(latest[id]) { latest[id] = try client.call("GET", "/v1/tasks/\(id)") }
        if ids.allSatisfy({ isFinal(latest[$0]) }) || Date() > deadline { break }
        pause(0.2)
    }
    return ids.compactMap { latest[$0] }
}

func isFinal(_ task: JSON?) -> Bool { task?["state"]?.stringValue.flatMap(TaskState.init(rawValue:))?.isFinal ?? false }

/// Every task of a session, page by page.
func allTasks(_ client: APIClient, session: String, state: String? = nil) throws(CLIError) -> [JSON] {
    var tasks: [JSON] = []
    var cursor = ""
    repeat {
        var path = "/v1/sessions/\(session)/tasks?limit=500"
        if let state { path += "&state=\(state)" }
        if !cursor.isEmpty { path += "&cursor=\(cursor)" }
        let page = try client.call("GET", path)
        tasks += page["tasks"]?.arrayValue ?? []
        cursor = page["next_cursor"]?.stringValue ?? ""
    } while !cursor.isEmpty
    return tasks
}

func sessionIDs(_ client: APIClient, _ only: String?) throws(CLIError) -> [String] {
    if let only { return [only] }
    return try client.call("GET", "/v1/sessions")["sessions"]?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? []
}

struct List: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "List tasks.")

    @OptionGroup var connection: Connection
    @Option(help: "Only this session.") var session: String?
    @Option(help: "Only tasks in this state.") var state: String?

    mutating func run() throws {
        try running {
            let client = try connection.client()
            var tasks: [JSON] = []
            for id in try sessionIDs(client, session) { tasks += try allTasks(client, session: id, state: state) }
            if connection.json {
                emit(JSON.array(tasks).serialized())
            } else {
                emit(Format.table(["ID", "STATE", "DONE", "SIZE", "URL"], tasks.map(Format.taskRow)))
            }
        }
    }
}

struct Show: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show one task.")

    @OptionGroup var connection: Connection
    @Argument var id: String

    mutating func run() throws {
        try running {
            let task = try connection.client().call("GET", "/v1/tasks/\(id)")
            if connection.json {
                emit(task.serialized())
                return
            }
            let progress = task["progress"]
            var lines = [
                ("id", task["id"]?.stringValue ?? ""), ("session", task["session_id"]?.stringValue ?? ""),
                ("state", (task["state"]?.stringValue ?? "") + (task["waiting_reason"]?.stringValue.map { " (\($0))" } ?? "")),
                ("kind", task["kind"]?.stringValue ?? ""),
                ("file", Format.localPath(task)), ("url", task["request"]?["url"]?.stringValue ?? ""),
                ("protocol", task["upload"]?["protocol"]?.stringValue ?? "-"),
                ("progress", "\(Format.bytes(Format.moved(progress))) of \(Format.bytes(progress?["bytes_total"]?.intValue ?? 0))"),
                ("attempts", String(task["attempts"]?.intValue ?? 0)),
            ]
            if let error = task["error"], !error.isNull { lines.append(("error", Format.errorLine(error))) }
            if let last = task["last_error"], !last.isNull, last["code"] != task["error"]?["code"] || task["error"] == .null {
                lines.append(("last error", Format.errorLine(last) + " at " + (last["at"]?.stringValue ?? "?")))
            }
            if let next = task["next_attempt_at"]?.stringValue { lines.append(("next try", next)) }
            if let status = task["response"]?["status"]?.intValue { lines.append(("response", "HTTP \(status)")) }
            var text = lines.map { "\($0.0):" + String(repeating: " ", count: max(1, 11 - $0.0.count)) + $0.1 }.joined(separator: "\n")
            let attempts = try connection.client().call("GET", "/v1/tasks/\(id)/attempts")["attempts"]?.arrayValue ?? []
            if !attempts.isEmpty { text += "\n\nattempts, newest first:\n" + Format.attempts(attempts) }
            emit(text)
        }
    }
}

/// cancel, suspend, resume: one command each, on one or more tasks.
protocol TaskCommandLine: ParsableCommand {
    static var verb: String { get }
    var connection: Connection { get }
    var ids: [String] { get }
}

extension TaskCommandLine {
    mutating func run() throws {
        try running {
            let client = try connection.client()
            var rows: [JSON] = []
            for id in ids { rows.append(try client.call("POST", "/v1/tasks/\(id)/\(Self.verb)")) }
            emit(connection.json ? JSON.array(rows).serialized() : Format.table(["ID", "STATE", "DONE", "SIZE", "URL"], rows.map(Format.taskRow)))
        }
    }
}

struct Cancel: TaskCommandLine {
    static let configuration = CommandConfiguration(abstract: "Cancel tasks.")
    static let verb = "cancel"
    @OptionGroup var connection: Connection
    @Argument var ids: [String]
}

struct Suspend: TaskCommandLine {
    static let configuration = CommandConfiguration(abstract: "Suspend tasks.")
    static let verb = "suspend"
    @OptionGroup var connection: Connection
    @Argument var ids: [String]
}

struct Resume: TaskCommandLine {
    static let configuration = CommandConfiguration(abstract: "Resume suspended tasks.")
    static let verb = "resume"
    @OptionGroup var connection: Connection
    @Argument var ids: [String]
}

struct Sessions: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List sessions and their task counts.")
    @OptionGroup var connection: Connection

    mutating func run() throws {
        try running {
            let sessions = try connection.client().call("GET", "/v1/sessions")["sessions"]?.arrayValue ?? []
            if connection.json {
                emit(JSON.array(sessions).serialized())
                return
            }
            let states = ["queued", "waiting", "running", "retrying", "completed", "failed", "cancelled"]
            emit(Format.table(["SESSION", "ENABLED"] + states.map { $0.uppercased() }, sessions.map { session in
                [session["id"]?.stringValue ?? "", String(session["enabled"]?.boolValue ?? false)]
                    + states.map { String(session["task_counts"]?[$0]?.intValue ?? 0) }
            }))
        }
    }
}

struct Network: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the network the policy sees; `set TYPE` overrides it, `auto` returns to detection.")

    @OptionGroup var connection: Connection
    @Argument(help: "Nothing (show), set, or auto.") var action: String?
    @Argument(help: "With set: wired, wifi, cellular, other or none.") var type: String?
    @Flag(help: "With set: mark the network expensive.") var expensive = false
    @Flag(help: "With set: mark the network constrained.") var constrained = false

    mutating func run() throws {
        try running {
            let client = try connection.client()
            let state: JSON
            switch action {
            case nil: state = try client.call("GET", "/v1/network")
            case "auto": state = try client.call("DELETE", "/v1/network")
            case "set":
                guard let type else { throw CLIError(status: .usage, description: "network set needs a type") }
                var body: JSONObject = ["type": .string(type)]
                if expensive { body["expensive"] = true }
                if constrained { body["constrained"] = true }
                state = try client.call("PUT", "/v1/network", .object(body))
            default: throw CLIError(status: .usage, description: "network takes set TYPE or auto")
            }
            emit(connection.json ? state.serialized() : [
                "type \(state["type"]?.stringValue ?? "?")", "interface \(state["interface"]?.stringValue ?? "-")",
                "expensive \(state["expensive"]?.boolValue ?? false)", "constrained \(state["constrained"]?.boolValue ?? false)",
                "source \(state["source"]?.stringValue ?? "?")",
            ].joined(separator: "  "))
        }
    }
}

struct Webhooks: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List a session's webhook subscriptions, or `add URL`.")

    @OptionGroup var connection: Connection
    @Option(help: "The session.") var session = "cli"
    @Argument(help: "Nothing (list) or add.") var action: String?
    @Argument(help: "With add: the receiver's URL.") var url: String?

    mutating func run() throws {
        try running {
            let client = try connection.client()
            if action == "add" {
                guard let url else { throw CLIError(status: .usage, description: "webhooks add needs a URL") }
                let created = try client.call("POST", "/v1/sessions/\(session)/webhooks", ["url": .string(url)])
                emit(connection.json ? created.serialized()
                     : "\(created["id"]?.stringValue ?? "") secret \(created["secret"]?.stringValue ?? "") (shown once)")
                return
            }
            let hooks = try client.call("GET", "/v1/sessions/\(session)/webhooks")["webhooks"]?.arrayValue ?? []
            emit(connection.json ? JSON.array(hooks).serialized() : Format.table(["ID", "ENABLED", "URL"], hooks.map {
                [$0["id"]?.stringValue ?? "", String($0["enabled"]?.boolValue ?? false), $0["url"]?.stringValue ?? ""]
            }))
        }
    }
}

struct Watch: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Live progress: one line per running task with rate and ETA, and a summary line.",
        discussion: """
            Progress comes from the daemon's event stream (GET /v1/events): a task.progress event \
            per running task every progress_interval (5 s unless the daemon is told otherwise), \
            and between events the bars move on at each task's last rate. The counts are asked \
            again only after a task changes state. With a client token, name one of its sessions.
            """)

    @OptionGroup var connection: Connection
    @Option(help: "Only this session.") var session: String?
    @Option(help: "Seconds between frames, at least.") var interval = 0.5
    @Flag(help: "Print one frame and exit.") var once = false
    @Flag(help: "Exit when no task is left unfinished.") var untilDone = false

    mutating func run() throws {
        try running {
            let client = try connection.client()
            let watch = LiveTasks(client: client, session: session, interval: interval, untilDone: untilDone)
            try watch.load()
            guard !once else {
                emit(WatchFrame.render(running: watch.runningTasks(at: monotonicSeconds()), counts: watch.counts))
                return
            }
            guard watch.drawIfDue() else { return }
            let path = "/v1/events" + (session.map { "?session=\($0)" } ?? "")
            var lastEventID: String?
            var lost: Double?
            // The stream ends when the daemon stops: follow it again from the last event seen, for
            // up to 30 seconds without it.
            while true {
                do {
                    lastEventID = try client.follow(path, lastEventID: lastEventID, receive: watch.apply, tick: watch.drawIfDue)
                    lost = nil
                } catch let error as CLIError where error.status == .unreachable {
                    let since = lost ?? monotonicSeconds()
                    lost = since
                    guard monotonicSeconds() - since < 30 else {
                        throw CLIError(status: .unreachable, description: "lost backhauld's event stream for 30 s: \(error)")
                    }
                }
                if let failure = watch.failure { throw failure }
                if watch.isOver { return }
                pause(1)
            }
        }
    }
}

/// What `watch` shows, kept current: the running tasks from the event stream (each task event
/// carries the task) and the counts by state, asked again after an event that changes states.
final class LiveTasks {
    private let client: APIClient
    private let session: String?
    private let interval: Double
    private let untilDone: Bool
    private let terminal = isatty(STDOUT_FILENO) == 1
    /// Running tasks by id, with when (monotonic) their data arrived.
    private var running: [String: (task: JSON, seen: Double)] = [:]
    private(set) var counts: [String: Int] = [:]
    private var countsStale = true
    /// Whether anything shown changed since the last frame, and when that frame was drawn.
    private var changed = true
    private var drawn = -Double.infinity
    /// Why watching stopped early (the counts could not be read).
    private(set) var failure: CLIError?

    init(client: APIClient, session: String?, interval: Double, untilDone: Bool) {
        self.client = client
        self.session = session
        self.interval = interval
        self.untilDone = untilDone
    }

    /// The running tasks, oldest first, their progress carried on to `now`.
    func runningTasks(at now: Double) -> [JSON] {
        func key(_ task: JSON) -> (String, String) { (task["created_at"]?.stringValue ?? "", task["id"]?.stringValue ?? "") }
        return running.values.map { WatchFrame.extrapolated($0.task, by: now - $0.seen) }.sorted { key($0) < key($1) }
    }

    var isOver: Bool {
        // Suspended tasks wait for a person, not for time: they do not keep `--until-done` going.
        failure != nil || (untilDone && TaskState.unfinished.allSatisfy { $0 == .suspended || (counts[$0.rawValue] ?? 0) == 0 })
    }

    /// The running tasks and the counts as they are now.
    func load() throws(CLIError) {
        for id in try sessionIDs(client, session) {
            for task in try allTasks(client, session: id, state: "running") {
                if let taskID = task["id"]?.stringValue { running[taskID] = (task, monotonicSeconds()) }
            }
        }
        try refreshCounts()
    }

    private func refreshCounts() throws(CLIError) {
        guard countsStale else { return }
        var counts: [String: Int] = [:]
        for id in try sessionIDs(client, session) {
            let detail = try client.call("GET", "/v1/sessions/\(id)")
            for (state, count) in detail["task_counts"]?.objectValue ?? [:] { counts[state, default: 0] += Int(count.intValue ?? 0) }
        }
        self.counts = counts
        countsStale = false
    }

    /// Takes in one event; false once watching is over.
    func apply(_ event: ServerSentEvent) -> Bool {
        if event.type.hasPrefix("task."), let task = (try? JSON.parse(event.data, maxDepth: 64))?["data"],
           let id = task["id"]?.stringValue {
            if task["state"]?.stringValue == "running" {
                running[id] = (task, monotonicSeconds())
            } else {
                running.removeValue(forKey: id)
            }
            if event.type != "task.progress" { countsStale = true }
        } else {
            countsStale = true
        }
        changed = true
        return drawIfDue()
    }

    /// Draws a frame when something changed (in a terminal, running tasks always move on) and
    /// `interval` has passed; false once watching is over.
    func drawIfDue() -> Bool {
        let now = monotonicSeconds()
        guard changed || (terminal && !running.isEmpty), now - drawn >= interval else { return !isOver }
        do {
            try refreshCounts()
        } catch {
            failure = error
            return false
        }
        if terminal { print("\u{1B}[H\u{1B}[2J", terminator: "") }
        emit(WatchFrame.render(running: runningTasks(at: now), counts: counts))
        fflush(nil)
        drawn = now
        changed = false
        return !isOver
    }
}

/// What `watch` prints each refresh (pure, so tests can check the rendering).
public enum WatchFrame {
    /// The task with its progress moved on by `seconds` at its last rate, up to its size: bars
    /// keep moving between progress events, and each event sets them right.
    public static func extrapolated(_ task: JSON, by seconds: Double) -> JSON {
        guard var object = task.objectValue, var progress = task["progress"]?.objectValue,
              let rate = progress["bytes_per_second"]?.intValue, rate > 0, seconds > 0
        else { return task }
        let key = task["kind"]?.stringValue == "download" ? "bytes_received" : "bytes_sent"
        var moved = (progress[key]?.intValue ?? 0) + Int64(Double(rate) * seconds)
        if let total = progress["bytes_total"]?.intValue, total > 0 {
            moved = min(moved, total)
            progress["fraction"] = .double(Double(moved) / Double(total))
            progress["eta_seconds"] = .double(Double(total - moved) / Double(rate))
        }
        progress[key] = .int(moved)
        object["progress"] = .object(progress)
        return .object(object)
    }

    public static func render(running: [JSON], counts: [String: Int]) -> String {
        var lines: [String] = running.map { task in
            let progress = task["progress"]
            let fraction = progress?["fraction"]?.doubleValue ?? 0
            let name = URL(fileURLWithPath: Format.localPath(task)).lastPathComponent
            return "\(task["id"]?.stringValue ?? "?")  \(name)  \(Format.bar(fraction)) \(Int((fraction * 100).rounded(.down)))%  "
                + "\(Format.bytes(Format.moved(progress)))/\(Format.bytes(progress?["bytes_total"]?.intValue ?? 0))  "
                + "\(Format.rate(progress?["bytes_per_second"]?.intValue ?? 0))  ETA \(Format.duration(progress?["eta_seconds"]?.doubleValue))"
        }
        let order = ["running", "queued", "waiting", "retrying", "suspended", "auth_required", "completed", "failed", "cancelled"]
        lines.append(order.map { "\(counts[$0] ?? 0) \($0)" }.joined(separator: ", "))
        return lines.joined(separator: "\n")
    }
}

/// Sleeps the calling thread (the CLI's only one) for `seconds`.
func pause(_ seconds: Double) {
    usleep(UInt32(seconds * 1_000_000))
}
