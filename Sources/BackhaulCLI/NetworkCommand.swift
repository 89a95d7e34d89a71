import ArgumentParser
import BackhaulClient

/// `network`: the network the policy sees, overridden or back to detection.
struct Network: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the network the policy sees; `set TYPE` overrides it, `auto` returns to detection.")

    @OptionGroup var connection: Connection
    @Argument(help: "Nothing (show), set, or auto.") var action: String?
    @Argument(help: "With set: wired, wifi, cellular, other or none.") var type: String?
    @Flag(help: "With set: mark the network expensive.") var expensive = false
    @Flag(help: "With set: mark the network constrained.") var constrained = false

    mutating func run() async throws {
        try await running {
            let client = connection.client()
            let reply: APIReply<APINetwork>
            switch action {
            case nil: reply = try await client.reply(.network)
            case "auto": reply = try await client.reply(.resetNetwork)
            case "set":
                guard let type else { throw CLIError(status: .usage, description: "network set needs a type") }
                // A flag not given leaves the daemon's rule for the type (cellular is expensive).
                reply = try await client.reply(
                    .setNetwork(
                        NetworkOverride(type: type, expensive: expensive ? true : nil, constrained: constrained ? true : nil)))
            default: throw CLIError(status: .usage, description: "network takes set TYPE or auto")
            }
            let state = reply.value
            emit(
                connection.json
                    ? try answerJSON(reply.body).serialized()
                    : [
                        "type \(state.type)", "interface \(state.interface ?? "-")", "expensive \(state.expensive)",
                        "constrained \(state.constrained)", "roaming \(state.roaming ?? false)",
                        "connectivity \(state.connectivity ?? "-")", "source \(state.source)",
                    ].joined(separator: "  "))
        }
    }
}
