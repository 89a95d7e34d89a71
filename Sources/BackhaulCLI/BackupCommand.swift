import ArgumentParser
import BackhaulClient
import Foundation

/// `backup FILE`: a consistent copy of the daemon's state while it runs (POST /v1/admin/backup).
struct Backup: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract:
            "Have the daemon write a consistent copy of its state to FILE (a new file; the daemon writes it, on its own file system)."
    )

    @OptionGroup var connection: Connection
    @Argument(help: "The copy's path; a relative one is taken from the current directory.") var file: String

    mutating func run() async throws {
        try await running {
            let path = file.hasPrefix("/") ? file : FileManager.default.currentDirectoryPath + "/" + file
            let reply = try await connection.client().reply(.backup(to: path))
            emit(
                connection.json
                    ? try answerJSON(reply.body).serialized() : "backed up to \(reply.value.path): \(reply.value.bytes) bytes")
        }
    }
}
