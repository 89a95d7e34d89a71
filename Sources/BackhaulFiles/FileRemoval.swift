import BackhaulCore
import Glibc
import Threads

/// How the store's committed batches remove files (`FileRemover`, wired by the server): through
/// the directory that holds each, walked beneath its allowed root with no symbolic link
/// (`Beneath`), with `unlinkat` on that descriptor, and only while the name still refers to the
/// task's file (device and inode where recorded, size and modification time). A removal that fails is counted (`failures`, the metric
/// `backhaul_file_removals_failed_total`) and reported to `failed`, never silent.
public final class FileRemoval: FileRemover {
    /// Why a file was not removed: the task's error (its `last_error`), and errno when a call failed.
    public struct Failure: Sendable, Equatable {
        public var error: TaskError
        public var errno: Int32?
    }

    public let roots: AllowedRoots
    public let failed: @Sendable (FileToRemove, Failure) -> Void
    private let failedCount = Locked(0)

    /// Removals that failed since the start.
    public var failures: Int { failedCount.withLock { $0 } }

    public init(roots: AllowedRoots, failed: @escaping @Sendable (FileToRemove, Failure) -> Void) {
        self.roots = roots
        self.failed = failed
    }

    public func remove(_ files: [FileToRemove]) {
        for file in files {
            guard let failure = Self.remove(file, roots: roots) else { continue }
            failedCount.withLock { $0 += 1 }
            failed(file, failure)
        }
    }

    /// Removes one file; nil when it is gone (also when it was gone already: a `.part` file that
    /// was never made, or an upload's file a client removed).
    public static func remove(_ file: FileToRemove, roots: AllowedRoots) -> Failure? {
        let directory: Beneath.Directory
        switch Beneath.parent(of: file.file.path, roots: roots) {
        case .success(let found): directory = found
        case .failure(.missing): return nil
        case .failure(let error): return Failure(error: removalError(file.kind, error.taskError.message), errno: nil)
        }
        let name = file.kind == .downloadPart ? directory.name + ".part" : directory.name
        guard let found = directory.statName(name) else { return failure(file.kind, errno) }
        guard found.st_mode & S_IFMT == S_IFREG else {
            return Failure(error: removalError(file.kind, "the name no longer leads to a regular file"), errno: nil)
        }
        if file.kind == .uploadedFile, !isTheTasks(found, file.file, roots: roots) {
            return Failure(error: removalError(file.kind, "the name now leads to another file"), errno: nil)
        }
        return unlinkat(directory.descriptor, name, 0) == 0 ? nil : failure(file.kind, errno)
    }

    /// A call's failure; nil for ENOENT (the file is gone, which is what was wanted).
    static func failure(_ kind: FileToRemove.Kind, _ code: Int32) -> Failure? {
        code == ENOENT ? nil : Failure(error: removalError(kind, String(cString: strerror(code))), errno: code)
    }

    /// Whether what the name leads to is the task's file: its device and inode (when recorded),
    /// size and modification time, as the upload checked them at its end. The size and time also
    /// tell a new file that reused a freed inode number.
    static func isTheTasks(_ found: stat, _ recorded: FileInfo, roots: AllowedRoots) -> Bool {
        if let identity = recorded.identity, !roots.isRecorded(identity, found.identity, at: recorded.path) { return false }
        return Int64(found.st_size) == recorded.size && found.modifiedNanoseconds == recorded.modifiedAtNanoseconds
    }

    static func removalError(_ kind: FileToRemove.Kind, _ why: String) -> TaskError {
        let what = kind == .downloadPart ? "the .part file was not removed" : "the file was not removed (delete_file_on_success)"
        return TaskError(.cannotRemoveFile, message: "\(what): \(why)")
    }
}
