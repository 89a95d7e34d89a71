import ArgumentParser
import BackhaulClient
import JSONCodec

/// `ls` and `show`: tasks listed, and one task in full with its attempts.
struct List: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "List tasks.")

    @OptionGroup var connection: Connection
    @Option(help: "Only this session.") var session: String?
    @Option(help: "Only tasks in this state.") var state: TaskState?

    mutating func run() async throws {
        try await running {
            let client = connection.client()
            var tasks: [APITask] = []
            var objects: [JSON] = []
            for id in try await client.sessionIDs(session) {
                var cursor: String?
                repeat {
                    let reply = try await client.reply(.tasks(session: id, state: state, cursor: cursor))
                    tasks += reply.value.tasks
                    if connection.json { objects += try answerItems(reply.body, "tasks") }
                    cursor = reply.value.nextCursor.flatMap { $0.isEmpty ? nil : $0 }
                } while cursor != nil
            }
            emit(connection.json ? Format.json(objects) : Format.tasks(tasks))
        }
    }
}

extension TaskState: ExpressibleByArgument {}

extension BackhaulClient {
    /// The one session asked for, or every session.
    func sessionIDs(_ only: String?) async throws(APIError) -> [String] {
        if let only { return [only] }
        return try await sessions().map(\.id)
    }
}

struct Show: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show one task.")

    @OptionGroup var connection: Connection
    @Argument var id: String

    mutating func run() async throws {
        try await running {
            let client = connection.client()
            let reply = try await client.reply(.task(id))
            if connection.json {
                emit(try answerJSON(reply.body).serialized())
                return
            }
            var text = Self.describe(reply.value)
            let attempts = try await client.attempts(task: id)
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
