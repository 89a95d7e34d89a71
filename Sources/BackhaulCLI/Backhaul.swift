import ArgumentParser
import BackhaulClient
import FoundationEssentials
import Glibc
import JSONCodec

import enum BackhaulCore.BackhaulVersion

/// `backhaul`: the command-line client of backhauld. Each group of commands has its file:
/// TransferCommands (upload, download), TaskCommands (ls, show), TaskControlCommands (cancel,
/// suspend, resume), SessionCommands (sessions, info), NetworkCommand, WebhookCommands,
/// WatchCommand (with WatchFrame); all of them speak to the daemon through `BackhaulClient`.
public struct Backhaul: AsyncParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "backhaul",
        abstract: "Hand uploads to backhauld and follow them.",
        discussion: """
            The daemon's address and token come from --url and --token or BACKHAUL_URL and BACKHAUL_TOKEN.
            Exit codes: 0 done, 1 the API refused, 3 a waited-for task failed or was cancelled,
            4 the daemon cannot be reached, 64 bad usage.
            """,
        version: "backhaul \(BackhaulVersion.string)",
        subcommands: [
            Upload.self, Download.self, List.self, Show.self, Cancel.self, Suspend.self, Resume.self, Sessions.self, Network.self,
            Webhooks.self, Watch.self, Info.self, Backup.self,
        ])

    public init() {}

    /// Parses the command line and runs the command: what `main.swift` calls (ArgumentParser's
    /// async entry point, named so that the blocking one is never picked instead).
    public static func runFromCommandLine() async {
        let main: () async -> Void = Self.main
        await main()
    }
}

/// Where the daemon is, and how to print.
struct Connection: ParsableArguments {
    @Option(help: "The daemon's URL (default: BACKHAUL_URL or http://127.0.0.1:8427).")
    var url: String?

    @Option(help: "A bearer token (default: BACKHAUL_TOKEN).")
    var token: String?

    @Flag(help: "Print JSON instead of tables, for scripts.")
    var json = false

    func client() -> BackhaulClient {
        let environment = ProcessInfo.processInfo.environment
        return BackhaulClient(
            url: url ?? environment["BACKHAUL_URL"] ?? "http://127.0.0.1:8427", token: token ?? environment["BACKHAUL_TOKEN"])
    }
}

/// Runs a command body, turning a `CLIError` or an `APIError` into its message on stderr and its
/// exit status.
func running(_ body: () async throws -> Void) async throws {
    let failure: CLIError
    do {
        try await body()
        return
    } catch let error as CLIError {
        failure = error
    } catch let error as APIError {
        failure = CLIError(error)
    }
    let message = Array("backhaul: \(failure.description)\n".utf8)
    _ = message.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    throw ExitCode(failure.status.rawValue)
}

func emit(_ text: String) { print(text) }

/// Waits `seconds` without holding a thread.
func pause(_ seconds: Double) async {
    try? await Task.sleep(for: .seconds(seconds))
}

/// An answer as the daemon sent it, for `--json` (the library's models are for the tables).
func answerJSON(_ body: [UInt8]) throws(CLIError) -> JSON {
    do {
        return try JSON.parse(body, maxDepth: 64)
    } catch {
        throw CLIError(status: .refused, description: "backhauld's answer is not JSON: \(error)")
    }
}

/// The array `member` of an answer, as sent.
func answerItems(_ body: [UInt8], _ member: String) throws(CLIError) -> [JSON] {
    try answerJSON(body)[member]?.arrayValue ?? []
}
