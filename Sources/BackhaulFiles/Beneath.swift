import BackhaulCore
import Glibc
import Synchronization
import Threads

/// Files by handle (docs/security.md): a task's path was resolved at enqueue (symbolic links,
/// `..`); from then on it is walked again for every operation, and no component may be a symbolic
/// link. A directory swapped for a link after enqueue is a swap: the walk fails, and nothing is
/// read, written or removed through it.
///
/// The path must lie beneath the allowed root that holds it, with no empty, `.` or `..` component
/// (checked on its bytes: `AllowedRoots.nameOffset`). Then one `openat2` with `RESOLVE_NO_SYMLINKS`
/// opens it walked from `/`: every directory it passes through is the one its name gives, none a
/// link, so the walk cannot leave the root, and the root is the directory its path leads to now,
/// as when it was opened by its path for each walk. Where that call answers ENOSYS (old kernels,
/// some container seccomp profiles; remembered after the first time), one `openat` per component
/// from `/` with `O_NOFOLLOW | O_DIRECTORY`, which refuses the same paths.
/// `BACKHAUL_FILES_WALK=components` in the environment forces the second (its tests).
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

    /// Set once `openat2` answered ENOSYS: the kernel will not grow it, so later walks go per
    /// component at once.
    private static let openat2Missing = Atomic<Bool>(false)

    /// Opens `path` itself with `flags` (`O_NOFOLLOW | O_CLOEXEC` added), walked with no symbolic
    /// link beneath the allowed root that holds it (by one `openat` per component when
    /// `componentsOnly`, or when `openat2` answers ENOSYS). `O_PATH` opens a name to look at.
    public static func open(
        _ path: String, roots: AllowedRoots, flags: Int32, componentsOnly: Bool = Beneath.componentsOnly
    ) -> Result<Int32, WalkError> {
        guard roots.nameOffset(of: path) != nil else { return .failure(.outsideRoots) }
        return walk(path, flags: flags | O_NOFOLLOW | O_CLOEXEC, componentsOnly: componentsOnly)
    }

    /// What `path` leads to now (`fstat` of the name opened `O_PATH`), walked as `open` walks it.
    public static func look(at path: String, roots: AllowedRoots) -> Result<stat, WalkError> {
        open(path, roots: roots, flags: OpenBeneath.pathOnly).flatMap { descriptor in
            defer { close(descriptor) }
            var info = stat()
            return fstat(descriptor, &info) == 0 ? .success(info) : .failure(.failed(errno))
        }
    }

    /// Opens the directory that holds `path`, beneath the allowed root that holds it (by one
    /// `openat` per component when `componentsOnly`, or when `openat2` answers ENOSYS).
    public static func parent(
        of path: String, roots: AllowedRoots, componentsOnly: Bool = Beneath.componentsOnly
    ) -> Result<Directory, WalkError> {
        guard let offset = roots.nameOffset(of: path) else { return .failure(.outsideRoots) }
        let utf8 = path.utf8
        let nameStart = utf8.index(utf8.startIndex, offsetBy: offset)
        let directoryPath = offset == 1 ? "/" : String(path[..<utf8.index(before: nameStart)])
        return walk(directoryPath, flags: directoryFlags, componentsOnly: componentsOnly).map { descriptor in
            Directory(descriptor: descriptor, name: String(path[nameStart...]), path: path)
        }
    }

    private static let directoryFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC

    /// `path` (absolute, checked by `AllowedRoots.nameOffset`, or its directory) opened with
    /// `flags`, no component a symbolic link.
    private static func walk(_ path: String, flags: Int32, componentsOnly: Bool) -> Result<Int32, WalkError> {
        if !componentsOnly && !openat2Missing.load(ordering: .relaxed) {
            let descriptor = OpenBeneath.open(path, flags: flags)
            if descriptor >= 0 { return .success(descriptor) }
            let failure = errno
            if failure != ENOSYS {
                return .failure(WalkError.from(errno: failure, "a component is a symbolic link, not a directory, or gone"))
            }
            openat2Missing.store(true, ordering: .relaxed)
        }
        return walkComponents(path, flags: flags)
    }

    /// One `openat` per component from `/`, each directory `O_NOFOLLOW | O_DIRECTORY`, the last
    /// with `flags`; each component ended in place in one copy of the path.
    private static func walkComponents(_ path: String, flags: Int32) -> Result<Int32, WalkError> {
        var text = Array(path.utf8CString)
        return text.withUnsafeMutableBufferPointer { bytes in
            var current = Glibc.open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard current >= 0 else { return .failure(WalkError.from(errno: errno, "/ cannot be opened")) }
            let end = bytes.count - 1
            var start = 1
            while start < end {
                var stop = start
                while stop < end && bytes[stop] != CChar(UInt8(ascii: "/")) { stop += 1 }
                bytes[stop] = 0
                let next = openat(current, bytes.baseAddress! + start, stop == end ? flags : directoryFlags)
                let failure = errno
                close(current)
                guard next >= 0 else {
                    let name = String(cString: bytes.baseAddress! + start)
                    return .failure(WalkError.from(errno: failure, "\(name) is a symbolic link, not a directory, or gone"))
                }
                current = next
                start = stop + 1
            }
            return .success(current)
        }
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
    /// The offset in bytes of the last component of `path`, when `path` lies beneath one of the
    /// roots (at least one component below it) and has no empty, `.` or `..` component; nil
    /// otherwise. On the path's bytes: it runs for every walk, twice an upload.
    func nameOffset(of path: String) -> Int? {
        var path = path
        return path.withUTF8 { bytes in
            let slash = UInt8(ascii: "/")
            let dot = UInt8(ascii: ".")
            guard bytes.first == slash, roots.contains(where: { Self.holds(bytes, root: $0) }) else { return nil }
            var start = 1
            while true {
                var stop = start
                while stop < bytes.count && bytes[stop] != slash { stop += 1 }
                let length = stop - start
                if length == 0 || (bytes[start] == dot && (length == 1 || (length == 2 && bytes[start + 1] == dot))) {
                    return nil
                }
                if stop == bytes.count { return start }
                start = stop + 1
            }
        }
    }

    /// Whether the path's `bytes` start with `root` and then a `/` and more.
    private static func holds(_ bytes: UnsafeBufferPointer<UInt8>, root: String) -> Bool {
        if root == "/" { return true }
        var root = root
        return root.withUTF8 { prefix in
            prefix.count > 0 && bytes.count > prefix.count + 1 && bytes[prefix.count] == UInt8(ascii: "/")
                && memcmp(bytes.baseAddress!, prefix.baseAddress!, prefix.count) == 0
        }
    }
}

extension stat {
    /// Device and inode.
    public var identity: FileIdentity { FileIdentity(device: UInt64(st_dev), inode: UInt64(st_ino)) }
}
