import ArgumentParser

/// `webhooks`: a session's subscriptions listed, or one added.
struct Webhooks: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List a session's webhook subscriptions, or `add URL`.")

    @OptionGroup var connection: Connection
    @Option(help: "The session.") var session = "cli"
    @Argument(help: "Nothing (list) or add.") var action: String?
    @Argument(help: "With add: the receiver's URL.") var url: String?

    mutating func run() throws {
        try running {
            let client = connection.client()
            if action == "add" {
                guard let url else { throw CLIError(status: .usage, description: "webhooks add needs a URL") }
                let created = try client.addWebhook(session: session, url: url)
                emit(connection.json ? created.json.serialized() : "\(created.id) secret \(created.secret ?? "") (shown once)")
                return
            }
            let hooks = try client.webhooks(session: session)
            emit(
                connection.json
                    ? Format.json(hooks.map(\.json))
                    : Format.table(
                        ["ID", "ENABLED", "URL"],
                        hooks.map {
                            [$0.id, String($0.enabled), $0.url]
                        }))
        }
    }
}
