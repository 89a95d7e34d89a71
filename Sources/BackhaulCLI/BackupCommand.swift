import ArgumentParser
import Foundation

/// `backup FILE`: a consistent copy of the daemon's state while it runs (POST /v1/admin/backup).
struct Backup: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract:
            "Have the daemon write a consistent copy of its state to FILE (a new file; the daemon writes it, on its own file system)."
    )

    @OptionGroup var connection: Connection
    @Argument(help: "The copy's path; a relative one is taken from the current directory.") var file: String

    mutating func run() throws {
        try running {
            let path = file.hasPrefix("/") ? file : FileManager.default.currentDirectoryPath + "/" + file
            let answer = try connection.client().backup(to: path)
            emit(
                connection.json
                    ? answer.serialized()
                    : "backed up to \(answer["path"]?.stringValue ?? path): \(answer["bytes"]?.intValue ?? 0) bytes")
        }
    }
}
