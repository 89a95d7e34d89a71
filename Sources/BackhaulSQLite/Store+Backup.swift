import BackhaulCore
import BackhaulQueue
import Glibc
import SQLite

extension Store {
    /// Writes a consistent copy of the database to `path` (absolute; it must not exist yet), as of
    /// the last commit when the copy began, without holding the writer: `VACUUM INTO` on a
    /// connection of its own, into a file beside `path` that is synced, linked at `path`, and its
    /// directory synced. The copy is a whole database with no log beside it.
    public func backup(to path: String) throws(StoreError) -> BackupResult {
        let started = monotonicSeconds()
        let partial = path + ".partial-\(getpid())-\(RandomID.make(prefix: "", at: now))"
        do {
            let connection = try Connection(path: self.path, readOnly: true)
            try connection.run("VACUUM INTO ?", [partial])
        } catch {
            unlink(partial)
            throw .database("the copy could not be written: \(error)")
        }
        let descriptor = open(partial, O_RDONLY | O_CLOEXEC)
        var failure: SyncFailure?
        if descriptor < 0 {
            failure = SyncFailure(errno: errno, call: "open", path: partial)
        } else {
            if fsync(descriptor) != 0 { failure = SyncFailure(errno: errno, call: "fsync", path: partial) }
            Glibc.close(descriptor)
        }
        // A link, not a rename: a file that appeared at `path` meanwhile is never replaced.
        if failure == nil, link(partial, path) != 0 {
            let code = errno
            unlink(partial)
            if code == EEXIST { throw .conflict("\(path) exists; a backup never replaces a file") }
            failure = SyncFailure(errno: code, call: "link", path: path)
        }
        unlink(partial)
        if let failure { throw .database("the copy could not be made durable: \(failure)") }
        if let failure = syncDirectory(of: path) { throw .database("the copy's directory could not be synced: \(failure)") }
        var info = stat()
        let bytes = stat(path, &info) == 0 ? Int64(info.st_size) : 0
        return BackupResult(path: path, bytes: bytes, seconds: monotonicSeconds() - started)
    }
}
