import BackhaulQueue
import Glibc

/// Whether the last process stopped cleanly and left the database as it is: a file `clean-stop`
/// beside the database, written and synced by `Store.close` once the log was copied back, naming
/// the database file's inode, size and modification time; the next open removes it (durably)
/// before it writes anything. A state without it, or whose database changed since (a crash, a
/// power loss, a kill, a file written while the daemon was stopped), has every page read for damage
/// at open (`StoreSalvage`); otherwise that read, seconds on a large state, is skipped
/// (docs/operations.md, "A damaged state").
enum CleanStop {
    static let name = "clean-stop"

    static func path(beside database: String) -> String {
        let directory = database.lastIndex(of: "/").map { String(database[..<$0]) } ?? "."
        return (directory.isEmpty ? "" : directory) + "/" + name
    }

    /// The database file as the marker describes it, or nil when it cannot be read.
    static func fingerprint(of database: String) -> String? {
        var info = stat()
        guard stat(database, &info) == 0 else { return nil }
        return "\(info.st_ino) \(info.st_size) \(info.st_mtim.tv_sec) \(info.st_mtim.tv_nsec)"
    }

    /// Whether the marker was there and describes the database as it is now; the marker is gone
    /// (and its removal on disk) when this returns.
    static func take(beside database: String) throws(StoreError) -> Bool {
        let marker = path(beside: database)
        guard let recorded = readMarker(marker) else { return false }
        guard unlink(marker) == 0 else { return false }
        if let failure = syncDirectory(of: marker) { throw .syncFailed(failure) }
        return recorded == fingerprint(of: database)
    }

    /// Leaves the marker for the database as it is, synced with its directory; false when it could
    /// not be made durable.
    @discardableResult
    static func mark(beside database: String) -> Bool {
        let marker = path(beside: database)
        guard let text = fingerprint(of: database) else { return false }
        let descriptor = open(marker, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { return false }
        let bytes = Array(text.utf8)
        let written = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) } == bytes.count
        let synced = written && fsync(descriptor) == 0
        close(descriptor)
        guard synced, syncDirectory(of: marker) == nil else {
            unlink(marker)
            return false
        }
        return true
    }

    private static func readMarker(_ path: String) -> String? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 128)
        let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
        guard count > 0 else { return "" }
        return String(decoding: buffer[..<count], as: UTF8.self)
    }
}
