import ArgumentParser
import BackhaulCore

/// cancel, suspend, resume: one command each, on one or more tasks.
protocol TaskControlCommand: ParsableCommand {
    static var command: TaskCommand { get }
    var connection: Connection { get }
    var ids: [String] { get }
}

extension TaskControlCommand {
    mutating func run() throws {
        try running {
            let client = connection.client()
            var tasks: [APITask] = []
            for id in ids { tasks.append(try client.perform(Self.command, task: id)) }
            emit(connection.json ? Format.json(tasks.map(\.json)) : Format.tasks(tasks))
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
