import ArgumentParser
import BackhaulClient
import JSONCodec

/// `sessions` and `info`: what the daemon holds, and how it is set up.
struct Sessions: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List sessions and their task counts.")
    @OptionGroup var connection: Connection

    mutating func run() async throws {
        try await running {
            let reply = try await connection.client().reply(.sessions)
            if connection.json {
                emit(Format.json(try answerItems(reply.body, "sessions")))
                return
            }
            let sessions = reply.value
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

struct Info: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the daemon's version, protocols and effective configuration (GET /v1/info).")
    @OptionGroup var connection: Connection

    mutating func run() async throws {
        try await running {
            let reply = try await connection.client().reply(.info)
            let json = try answerJSON(reply.body)
            if connection.json {
                emit(json.serialized())
                return
            }
            let info = reply.value
            // The settings in the daemon's order: every member but the three above.
            let settings = (json.objectValue ?? [:]).entries.filter { !["version", "protocols", "task_counts"].contains($0.key) }
            let rows =
                [["version", info.version], ["protocols", info.protocols.joined(separator: ", ")]]
                + settings.map { [$0.key, $0.value.stringValue ?? $0.value.serialized()] }
            emit(Format.table(["SETTING", "VALUE"], rows))
        }
    }
}
