import BackhaulCore
import Threads

/// The `FileRemover` a store's writer hands the files of its committed batches to (set by the
/// server through `StateStore.removeFiles(with:)`). The store decides which files go and when;
/// how they are removed is the remover's (BackhaulFiles, beneath the allowed roots).
package final class FileRemoverSlot: Sendable {
    private let remover = Locked<(any FileRemover)?>(nil)

    package init() {}

    package func set(_ remover: any FileRemover) { self.remover.withLock { $0 = remover } }

    /// Hands `files` to the remover, if there are any and one is set.
    package func remove(_ files: [FileToRemove]) {
        guard !files.isEmpty, let remover = remover.withLock({ $0 }) else { return }
        remover.remove(files)
    }
}
