import ArgumentParser
import BackhaulClient
import FoundationEssentials
import JSONCodec

/// `upload` and `download`: tasks handed over, optionally waited for.
struct Upload: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Upload files in the background.")

    @OptionGroup var connection: Connection

    @Argument(help: "Files to upload (absolute or relative paths inside the daemon's allowed roots).")
    var files: [String]

    @Option(help: "Destination URL; {name} is replaced by the file's name, and a URL ending in / gets it appended.")
    var to: String

    @Option(
        name: .customLong("protocol"),
        help:
            "raw, multipart, chunked, tus, s3, ietf (IETF resumable uploads) or auto (ask the server: ietf, else tus, else raw; recommended when the server is unknown)."
    )
    var protocolName = "raw"

    @Option(help: "ietf and auto: the draft interop version to speak (3, 5 or 6; default: the newest the server takes).")
    var interopVersion: Int?

    @Option(help: "HTTP method of the upload.")
    var method: String?

    @Option(help: "Chunk or part size in bytes (chunked, tus, s3).")
    var chunkSize: Int?

    @OptionGroup var submission: Submission

    mutating func run() async throws {
        try await running {
            let headers = try submission.parsedHeaders()
            // tus creates the upload and multipart posts a form: POST unless told otherwise.
            let method = method ?? (protocolName == "tus" || protocolName == "multipart" ? "POST" : nil)
            let tasks = files.map { file in
                let path = absolute(file)
                let name = URL(fileURLWithPath: path).lastPathComponent
                let url = to.contains("{name}") ? to.replacing("{name}", with: name) : to.hasSuffix("/") ? to + name : to
                return NewTask.upload(
                    file: path, url: url, method: method, headers: headers, protocol: protocolName, chunkSize: chunkSize,
                    interopVersion: interopVersion)
            }
            try await submission.submit(tasks, connection: connection)
        }
    }
}

struct Download: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Download a URL in the background.")

    @OptionGroup var connection: Connection

    @Argument(help: "The URL to fetch (GET).")
    var url: String

    @Option(
        help:
            "Where the file goes (inside the daemon's allowed roots; its directory must exist). A path ending in / gets the URL's last segment."
    )
    var to: String

    @Option(help: "The SHA-256 the file must have (hex); checked before it is put in place.")
    var sha256: String?

    @Flag(help: "Replace a file already at the destination.")
    var overwrite = false

    @OptionGroup var submission: Submission

    mutating func run() async throws {
        try await running {
            var path = absolute(to)
            if path.hasSuffix("/") {
                let name = URL(string: url)?.lastPathComponent ?? ""
                guard !name.isEmpty, name != "/" else {
                    throw CLIError(status: .usage, description: "the URL has no file name: give --to a file path")
                }
                path += name
            }
            let task = NewTask.download(
                url: url, destination: path, headers: try submission.parsedHeaders(), overwrite: overwrite,
                sha256: sha256)
            try await submission.submit([task], connection: connection)
        }
    }
}

/// A path as given, or under the working directory.
private func absolute(_ path: String) -> String {
    path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
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

    /// The `Name: value` options as pairs.
    func parsedHeaders() throws(CLIError) -> [(String, String)] {
        var pairs: [(String, String)] = []
        for header in headers {
            guard let colon = header.firstIndex(of: ":") else {
                throw CLIError(status: .usage, description: "a header is Name: value, not \(header)")
            }
            pairs.append((String(header[..<colon]), String(header[header.index(after: colon)...].trimmingWhitespace())))
        }
        return pairs
    }

    /// Creates the tasks in one batch (the session first, when missing), waits for them with
    /// `--wait`, and prints them; exit 3 when a waited-for task did not complete.
    func submit(_ tasks: [NewTask], connection: Connection) async throws {
        let client = connection.client()
        try await client.ensureSession(session)
        let created = try await client.reply(.createTasks(tasks, session: session))
        var results = created.value
        var objects = connection.json ? try answerItems(created.body, "tasks") : []
        if wait { (results, objects) = try await waitForAll(client, results.map(\.id), timeout: timeout) }
        emit(connection.json ? Format.json(objects) : Format.tasks(results))
        if wait, results.contains(where: { $0.state != .completed }) {
            throw CLIError(status: .taskUnsuccessful, description: "not every task completed")
        }
    }
}

/// Polls until every task is final (or the timeout passes); returns the tasks as last seen, and
/// each as the daemon sent it.
private func waitForAll(_ client: BackhaulClient, _ ids: [String], timeout: Double) async throws -> ([APITask], [JSON]) {
    let deadline = ContinuousClock.now + .seconds(timeout)
    var latest: [String: APIReply<APITask>] = [:]
    func isFinal(_ id: String) -> Bool { latest[id]?.value.state.isFinal ?? false }
    while true {
        for id in ids where !isFinal(id) { latest[id] = try await client.reply(.task(id)) }
        if ids.allSatisfy(isFinal) || ContinuousClock.now > deadline { break }
        await pause(0.2)
    }
    let replies = ids.compactMap { latest[$0] }
    return (replies.map(\.value), try replies.map { (reply) throws(CLIError) in try answerJSON(reply.body) })
}

extension Substring {
    /// Without the whitespace at either end.
    func trimmingWhitespace() -> Substring {
        var text = drop(while: \.isWhitespace)
        while text.last?.isWhitespace == true { text = text.dropLast() }
        return text
    }
}
