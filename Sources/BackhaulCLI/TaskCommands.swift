import ArgumentParser

/// `ls` and `show`: tasks listed, and one task in full with its attempts.
struct List: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "List tasks.")

    @OptionGroup var connection: Connection
    @Option(help: "Only this session.") var session: String?
    @Option(help: "Only tasks in this state.") var state: String?

    mutating func run() throws {
        try running {
            let client = connection.client()
            var tasks: [APITask] = []
            for id in try client.sessionIDs(session) { tasks += try client.allTasks(session: id, state: state) }
            emit(connection.json ? Format.json(tasks.map(\.json)) : Format.tasks(tasks))
        }
    }
}

extension BackhaulClient {
    /// The one session asked for, or every session.
    func sessionIDs(_ only: String?) throws(APIError) -> [String] {
        if let only { return [only] }
        return try sessions().map(\.id)
    }
}

struct Show: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show one task.")

    @OptionGroup var connection: Connection
    @Argument var id: String

    mutating func run() throws {
        try running {
            let client = connection.client()
            let task = try client.task(id)
            if connection.json {
                emit(task.json.serialized())
                return
            }
            var text = Self.describe(task)
            let attempts = try client.attempts(task: id)
            if !attempts.isEmpty { text += "\n\nattempts, newest first:\n" + Format.attempts(attempts) }
            emit(text)
        }
    }

    /// `name:` and value lines, the values aligned: state, progress, attempts, error, the last
    /// failed attempt's error (unless it is the error the task ended with), the final response.
    static func describe(_ task: APITask) -> String {
        let progress = task.progress
        var lines = [
            ("id", task.id), ("session", task.sessionID),
            ("state", task.state.rawValue + (task.waitingReason.map { " (\($0))" } ?? "")),
            ("kind", task.kind.rawValue), ("file", task.localPath ?? "?"), ("url", task.url),
            ("protocol", task.uploadProtocol ?? "-"),
            ("progress", "\(Format.bytes(progress.moved)) of \(Format.bytes(progress.bytesTotal ?? 0))"),
            ("attempts", String(task.attempts)),
        ]
        if let error = task.error { lines.append(("error", Format.errorLine(error))) }
        if let last = task.lastError, last.code != task.error?.code {
            lines.append(("last error", Format.errorLine(last) + " at " + (last.at ?? "?")))
        }
        if let next = task.nextAttemptAt { lines.append(("next try", next)) }
        if let status = task.responseStatus { lines.append(("response", "HTTP \(status)")) }
        return lines.map { "\($0.0):" + String(repeating: " ", count: max(1, 11 - $0.0.count)) + $0.1 }.joined(separator: "\n")
    }
}
