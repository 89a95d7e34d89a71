import BackhaulCore
import Glibc
import Threads

/// Files by handle (docs/security.md): a task's path was resolved at enqueue (symbolic links,
/// `..`); from then on it is walked again from its allowed root for every operation, through
/// directory descriptors, and no component may be a symbolic link. A directory swapped for a link
/// after enqueue is a swap: the walk fails, and nothing is read, written or removed through it.
///
/// The walk is `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`; where that call answers
/// ENOSYS (old kernels, some container seccomp profiles), one `openat` per component with
/// `O_NOFOLLOW | O_DIRECTORY`. `BACKHAUL_FILES_WALK=components` in the environment forces the
/// second (its tests).
public enum Beneath {
    /// Why a path no longer leads where it did.
    public enum WalkError: Error, Equatable {
        /// No allowed root holds the path (the roots changed since enqueue).
        case outsideRoots
        /// A component is now a symbolic link or not a directory, or the name leads to another file.
        case swapped(String)
        /// A component or the file is gone.
        case missing
        /// The daemon may not open a component.
        case denied
        /// Any other errno.
        case failed(Int32)

        /// The task's error: `-4001 file_changed` with reason `path_changed` for a swap, else the
        /// code a vanished or unreadable file has.
        public var taskError: TaskError {
            switch self {
            case .outsideRoots:
                return TaskError(.fileChanged, message: "the path is no longer inside an allowed root", reason: .pathChanged)
            case .swapped(let what):
                return TaskError(
                    .fileChanged, message: "the path no longer leads to the task's file: \(what)", reason: .pathChanged)
            case .missing: return TaskError(.fileDoesNotExist, message: "the file no longer exists")
            case .denied: return TaskError(.noPermissionsToReadFile, message: "the file is no longer readable")
            case .failed(let code):
                return TaskError(.fileDoesNotExist, message: "cannot reach the file: \(String(cString: strerror(code)))")
            }
        }

        static func from(errno code: Int32, _ what: String) -> WalkError {
            switch code {
            case ELOOP, EXDEV, ENOTDIR: return .swapped(what)
            case ENOENT: return .missing
            case EACCES, EPERM: return .denied
            default: return .failed(code)
            }
        }
    }

    /// Whether the walk uses one `openat` per component only (`BACKHAUL_FILES_WALK=components`).
    public static let componentsOnly = getenv("BACKHAUL_FILES_WALK").map { String(cString: $0) == "components" } ?? false

    /// Opens the directory that holds `path`, beneath the allowed root that holds it (by one
    /// `openat` per component when `componentsOnly`, or when `openat2` answers ENOSYS).
    public static func parent(
        of path: String, roots: AllowedRoots, componentsOnly: Bool = Beneath.componentsOnly
    ) -> Result<Directory, WalkError> {
        guard let (root, components) = roots.locate(path), let name = components.last else { return .failure(.outsideRoots) }
        let rootDescriptor = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard rootDescriptor >= 0 else { return .failure(WalkError.from(errno: errno, "the allowed root \(root)")) }
        let directories = components.dropLast()
        if directories.isEmpty { return .success(Directory(descriptor: rootDescriptor, name: String(name), path: path)) }
        defer { close(rootDescriptor) }
        let flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC
        if !componentsOnly {
            let descriptor = OpenBeneath.open(rootDescriptor, directories.joined(separator: "/"), flags: flags)
            if descriptor >= 0 { return .success(Directory(descriptor: descriptor, name: String(name), path: path)) }
            if errno != ENOSYS { return .failure(WalkError.from(errno: errno, "a directory in it is a symbolic link or gone")) }
        }
        var current = dup(rootDescriptor)
        for component in directories {
            guard component != "..", component != "." else {
                close(current)
                return .failure(.swapped("it has a \(component) component"))
            }
            let next = openat(current, String(component), flags | O_NOFOLLOW)
            let failure = errno
            close(current)
            guard next >= 0 else { return .failure(WalkError.from(errno: failure, "\(component) is a symbolic link or gone")) }
            current = next
        }
        return .success(Directory(descriptor: current, name: String(name), path: path))
    }

    /// A directory held open beneath an allowed root, and the name in it a task's path ends with.
    public final class Directory {
        public let descriptor: Int32
        public let name: String
        /// The whole path, for messages.
        public let path: String

        init(descriptor: Int32, name: String, path: String) {
            self.descriptor = descriptor
            self.name = name
            self.path = path
        }

        deinit { close(descriptor) }

        /// What `name` is in this directory, not following a link (`fstatat`).
        public func statName(_ entry: String? = nil) -> stat? {
            var info = stat()
            return fstatat(descriptor, entry ?? name, &info, AT_SYMLINK_NOFOLLOW) == 0 ? info : nil
        }

        /// Whether this is the same directory as `other` (device and inode).
        public func isSame(as other: Directory) -> Bool {
            var mine = stat()
            var theirs = stat()
            guard fstat(descriptor, &mine) == 0, fstat(other.descriptor, &theirs) == 0 else { return false }
            return mine.identity == theirs.identity
        }
    }
}

extension AllowedRoots {
    /// The allowed root that holds `path` (the longest), and the path's components beneath it.
    func locate(_ path: String) -> (root: String, components: [Substring])? {
        var best: String?
        for root in roots where root == "/" || path.hasPrefix(root.hasSuffix("/") ? root : root + "/") {
            if best == nil || root.count > best!.count { best = root }
        }
        guard let root = best else { return nil }
        let components = path.dropFirst(root.count).split(separator: "/")
        return components.isEmpty ? nil : (root, components)
    }
}

extension stat {
    /// Device and inode.
    public var identity: FileIdentity { FileIdentity(device: UInt64(st_dev), inode: UInt64(st_ino)) }
}
