import ArgumentParser
import BackhaulClient
import JSONCodec

/// cancel, suspend, resume: one command each, on one or more tasks.
protocol TaskControlCommand: AsyncParsableCommand {
    static var command: TaskCommand { get }
    var connection: Connection { get }
    var ids: [String] { get }
}

extension TaskControlCommand {
    mutating func run() async throws {
        try await running {
            let client = connection.client()
            var tasks: [APITask] = []
            var objects: [JSON] = []
            for id in ids {
                let reply = try await client.reply(.perform(Self.command, task: id))
                tasks.append(reply.value)
                if connection.json { objects.append(try answerJSON(reply.body)) }
            }
            emit(connection.json ? Format.json(objects) : Format.tasks(tasks))
        }
    }
}

struct Cancel: TaskControlCommand {
    static let configuration = CommandConfiguration(abstract: "Cancel tasks.")
    static let command = TaskCommand.cancel
    @OptionGroup var connection: Connection
    @Argument var ids: [String]
}

struct Suspend: TaskControlCommand {
    static let configuration = CommandConfiguration(abstract: "Suspend tasks.")
    static let command = TaskCommand.suspend
    @OptionGroup var connection: Connection
    @Argument var ids: [String]
}

struct Resume: TaskControlCommand {
    static let configuration = CommandConfiguration(abstract: "Resume suspended tasks.")
    static let command = TaskCommand.resume
    @OptionGroup var connection: Connection
    @Argument var ids: [String]
}
