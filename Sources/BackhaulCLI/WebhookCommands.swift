import ArgumentParser
import BackhaulClient

/// `webhooks`: a session's subscriptions listed, or one added.
struct Webhooks: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List a session's webhook subscriptions, or `add URL`.")

    @OptionGroup var connection: Connection
    @Option(help: "The session.") var session = "cli"
    @Argument(help: "Nothing (list) or add.") var action: String?
    @Argument(help: "With add: the receiver's URL.") var url: String?

    mutating func run() async throws {
        try await running {
            let client = connection.client()
            if action == "add" {
                guard let url else { throw CLIError(status: .usage, description: "webhooks add needs a URL") }
                let reply = try await client.reply(.addWebhook(session: session, url: url))
                let created = reply.value
                emit(
                    connection.json
                        ? try answerJSON(reply.body).serialized() : "\(created.id) secret \(created.secret ?? "") (shown once)")
                return
            }
            let reply = try await client.reply(.webhooks(session: session))
            let hooks = reply.value
            emit(
                connection.json
                    ? Format.json(try answerItems(reply.body, "webhooks"))
                    : Format.table(
                        ["ID", "ENABLED", "URL"],
                        hooks.map {
                            [$0.id, String($0.enabled), $0.url]
                        }))
        }
    }
}
