import ArgumentParser
import BackhaulCore
import JSONCodec

/// `sessions` and `info`: what the daemon holds, and how it is set up.
struct Sessions: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List sessions and their task counts.")
    @OptionGroup var connection: Connection

    mutating func run() throws {
        try running {
            let sessions = try connection.client().sessions()
            if connection.json {
                emit(Format.json(sessions.map(\.json)))
                return
            }
            let states: [TaskState] = [.queued, .waiting, .running, .retrying, .completed, .failed, .cancelled]
            emit(
                Format.table(
                    ["SESSION", "ENABLED"] + states.map { $0.rawValue.uppercased() },
                    sessions.map { session in
                        [session.id, String(session.enabled)] + states.map { String(session.taskCounts[$0] ?? 0) }
                    }))
        }
    }
}

struct Info: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the daemon's version, protocols and effective configuration (GET /v1/info).")
    @OptionGroup var connection: Connection

    mutating func run() throws {
        try running {
            let info = try connection.client().info()
            if connection.json {
                emit(info.json.serialized())
                return
            }
            let rows =
                [["version", info.version], ["protocols", info.protocols.joined(separator: ", ")]]
                + info.settings.map { [$0.name, $0.value.stringValue ?? $0.value.serialized()] }
            emit(Format.table(["SETTING", "VALUE"], rows))
        }
    }
}
