import BackhaulCore

/// The files a transaction makes useless, removed once its commit is durable (docs/fleet.md,
/// "Durable before delete"): the source of a task completed with `delete_file_on_success`, and the
/// `.part` file of a download that ended without completing. A removal is for good, while a commit
/// that is not yet on disk may be undone by a crash of the machine or of the database server; so
/// both writers (`StoreWriter`, `PostgresWriter`) follow this one rule: note the files as the rows
/// change (`note`), make the commit that holds any durable (`needsDurableCommit`), and only then
/// hand them to the remover the server set (`remove(through:)`; BackhaulFiles removes each beneath
/// its allowed root, only while its name still leads to the task's file).
package struct FileRemovals: Sendable {
    /// The files to remove, in the order noted.
    package private(set) var files: [FileToRemove] = []

    package init() {}

    package var isEmpty: Bool { files.isEmpty }
    package var count: Int { files.count }

    /// Notes what a task's change from `before` (nil: created) to `after` leaves to remove.
    package mutating func note(from before: TaskRecord?, to after: TaskRecord) {
        guard TaskTransition.finished(from: before, to: after) else { return }
        if after.kind == .download {
            if after.state != .completed, before != nil { files.append(.downloadPart(of: after)) }
        } else if after.state == .completed, after.deleteFileOnSuccess {
            files.append(.uploadedFile(of: after))
        }
    }

    /// Forgets what was noted after the first `count` (a savepoint rolled back).
    package mutating func rollBack(to count: Int) { files.removeSubrange(count...) }

    /// Whether the commit must reach the disk (SQLite's WAL synced, PostgreSQL's
    /// `synchronous_commit` on) before its answers go and its files are removed: when a job
    /// asked for it (`durable`, a client's write), or when there are files to remove.
    package func needsDurableCommit(durable: Bool) -> Bool { durable || !isEmpty }

    /// Removes the files, after the durable commit: the one place a task's file is removed.
    package func remove(through remover: FileRemoverSlot) { remover.remove(files) }
}
