import BackhaulCore
import Glibc

/// The files a transaction makes useless, removed once its commit is durable (SPEC §6.1): the
/// source of a task completed with `delete_file_on_success`, and the `.part` file of a download
/// that ended without completing. A removal is for good, while a commit that is not yet on disk
/// may be undone by a crash of the machine or of the database server; so both writers
/// (`StoreWriter`, `PostgresWriter`) follow this one rule: note the files as the rows change
/// (`note`), make the commit that holds any durable (`needsDurableCommit`), and only then remove
/// them (`remove`).
package struct FileRemovals: Sendable {
    /// The paths to remove, in the order noted.
    package private(set) var paths: [String] = []

    package init() {}

    package var isEmpty: Bool { paths.isEmpty }
    package var count: Int { paths.count }

    /// Notes what a task's change from `before` (nil: created) to `after` leaves to remove.
    package mutating func note(from before: TaskRecord?, to after: TaskRecord) {
        guard TaskTransition.finished(from: before, to: after) else { return }
        if after.kind == .download {
            if after.state != .completed, before != nil { paths.append(DownloadSpec.partPath(of: after.file.path)) }
        } else if after.state == .completed, after.deleteFileOnSuccess {
            paths.append(after.file.path)
        }
    }

    /// Forgets what was noted after the first `count` (a savepoint rolled back).
    package mutating func rollBack(to count: Int) { paths.removeSubrange(count...) }

    /// Whether the commit must reach the disk (SQLite's WAL synced, PostgreSQL's
    /// `synchronous_commit` on) before its answers go and its files are removed: when a job
    /// asked for it (`durable`, a client's write), or when there are files to remove.
    package func needsDurableCommit(durable: Bool) -> Bool { durable || !isEmpty }

    /// Removes the files, after the durable commit: the one place a task's file is removed.
    package func remove() {
        for path in paths { unlink(path) }
    }
}
