import Glibc

/// `fsync` of the directory that holds `path`: the names made or renamed in it are on disk after
/// it. The failure, or nil.
package func syncDirectory(of path: String) -> SyncFailure? {
    let directory = path.lastIndex(of: "/").map { String(path[..<$0]) } ?? "."
    return syncDirectory(at: directory.isEmpty ? "/" : directory)
}

/// `fsync` of `directory` itself. The failure, or nil.
package func syncDirectory(at directory: String) -> SyncFailure? {
    let descriptor = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard descriptor >= 0 else { return SyncFailure(errno: errno, call: "open", path: directory) }
    defer { close(descriptor) }
    guard fsync(descriptor) == 0 else { return SyncFailure(errno: errno, call: "fsync", path: directory) }
    return nil
}

/// A sync of the state that failed: the call, its errno and the file.
public struct SyncFailure: Sendable, Equatable, CustomStringConvertible {
    public let errno: Int32
    public let call: String
    public let path: String

    /// The errno's symbolic name where it is one a disk gives (EIO, ENOSPC, …), else its number.
    public var errnoName: String {
        switch errno {
        case EIO: return "EIO"
        case ENOSPC: return "ENOSPC"
        case EDQUOT: return "EDQUOT"
        case EROFS: return "EROFS"
        case EBADF: return "EBADF"
        case ENOENT: return "ENOENT"
        case EACCES: return "EACCES"
        default: return "errno \(errno)"
        }
    }

    /// The disk is full (ENOSPC, EDQUOT).
    public var isDiskFull: Bool { errno == ENOSPC || errno == EDQUOT }

    public var description: String { "\(call) of \(path) failed: \(errnoName) (\(String(cString: strerror(errno))))" }

    package init(errno: Int32, call: String, path: String) {
        self.errno = errno
        self.call = call
        self.path = path
    }
}
