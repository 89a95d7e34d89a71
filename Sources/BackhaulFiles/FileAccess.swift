import BackhaulCore
import Glibc

/// Why a path cannot be uploaded (OpenAPI/backhaul.yaml `file`).
public enum FileAccessError: Error, Sendable, Equatable {
    case notAbsolute, notFound, isDirectory, notRegularFile, notReadable, outsideAllowedRoots
    /// Downloads: the destination's directory is missing, cannot be written, or a file is there.
    case directoryNotFound, notWritable, destinationExists

    /// The API's problem code.
    public var code: String {
        switch self {
        case .notAbsolute: return "validation_failed"
        case .notFound: return "file_not_found"
        case .isDirectory: return "file_is_directory"
        case .notRegularFile: return "file_not_regular"
        case .notReadable: return "file_not_readable"
        case .outsideAllowedRoots: return "file_outside_allowed_roots"
        case .directoryNotFound: return "file_not_found"
        case .notWritable: return "file_not_writable"
        case .destinationExists: return "destination_exists"
        }
    }

    public var message: String {
        switch self {
        case .notAbsolute: return "file must be an absolute path"
        case .notFound: return "no such file"
        case .isDirectory: return "the path is a directory"
        case .notRegularFile: return "only regular files can be uploaded (not devices, FIFOs or sockets)"
        case .notReadable: return "the daemon cannot read the file"
        case .outsideAllowedRoots: return "the file is outside the allowed roots"
        case .directoryNotFound: return "the destination's directory does not exist"
        case .notWritable: return "the daemon cannot write to the destination's directory"
        case .destinationExists: return "a file is already at the destination (set overwrite to replace it)"
        }
    }
}

/// The directories files may be read from. Paths are resolved (symlinks, `..`) before the check.
public struct AllowedRoots: Sendable, Equatable {
    public let roots: [String]
    /// The shared roots (docs/fleet.md), resolved alike: every node sees them, each through its own
    /// mount, so a file's device number there differs from node to node (its inode does not).
    public let shared: [String]

    /// Resolves each root; roots that do not exist are kept as given (nothing matches them).
    public init(_ roots: [String], shared: [String] = []) {
        self.roots = roots.map { AllowedRoots.realPath($0) ?? $0 }
        self.shared = shared.map { AllowedRoots.realPath($0) ?? $0 }
    }

    /// Whether a task's recorded identity is the file `found`: the same inode, and the same
    /// device unless the path is under a shared root (another node may have recorded it).
    public func isRecorded(_ identity: FileIdentity, _ found: FileIdentity, at path: String) -> Bool {
        guard identity.inode == found.inode else { return false }
        return identity.device == found.device || shared.contains { path.hasPrefix($0.hasSuffix("/") ? $0 : $0 + "/") }
    }

    public static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// The path with its deepest existing ancestor resolved and the rest appended as written
    /// (`..` in the rest is resolved lexically).
    static func resolveExistingPrefix(_ path: String) -> String {
        var components = path.split(separator: "/").map(String.init)
        var rest: [String] = []
        while !components.isEmpty {
            if let base = realPath("/" + components.joined(separator: "/")) {
                var parts = base.split(separator: "/").map(String.init)
                for component in rest.reversed() {
                    if component == ".." {
                        if !parts.isEmpty { parts.removeLast() }
                    } else if component != "." {
                        parts.append(component)
                    }
                }
                return "/" + parts.joined(separator: "/")
            }
            rest.append(components.removeLast())
        }
        return "/"
    }

    public func contains(resolvedPath path: String) -> Bool {
        roots.contains { root in
            root == "/" || path == root || path.hasPrefix(root.hasSuffix("/") ? root : root + "/")
        }
    }

    /// Checks a client-given path and describes the file it names.
    public func inspect(_ path: String) -> Result<FileInfo, FileAccessError> {
        guard path.hasPrefix("/") else { return .failure(.notAbsolute) }
        guard let resolved = AllowedRoots.realPath(path) else {
            let failure: FileAccessError = errno == EACCES ? .notReadable : .notFound
            // Say "outside" for any path outside the roots, existing or not: no existence leak.
            return .failure(contains(resolvedPath: AllowedRoots.resolveExistingPrefix(path)) ? failure : .outsideAllowedRoots)
        }
        // Outside before anything else about the file, as `check` would say it too.
        guard contains(resolvedPath: resolved) else { return .failure(.outsideAllowedRoots) }
        var info = stat()
        guard stat(resolved, &info) == 0 else { return .failure(.notFound) }
        return check(resolved, info)
    }

    /// `inspect` for the files of one request, which mostly share a few directories: each
    /// directory is resolved once (`directories`), and a file in it is looked at with `lstat`. A
    /// name that is a symbolic link, or anything that does not check out this way, goes through
    /// `inspect` itself, so every refusal is the one `inspect` gives. `realpath` reads every
    /// component of a path as a link (`readlink`), so this saves four system calls a file in a
    /// directory three deep. A directory is resolved as it was when the request's first file in it
    /// was checked.
    public func inspect(_ path: String, directories: inout ResolvedDirectories) -> Result<FileInfo, FileAccessError> {
        guard let (directory, name) = AllowedRoots.split(path) else { return inspect(path) }
        let resolvedDirectory: String
        if let known = directories.resolved[directory] {
            resolvedDirectory = known
        } else {
            guard let resolved = AllowedRoots.realPath(directory) else { return inspect(path) }
            directories.resolved[directory] = resolved
            resolvedDirectory = resolved
        }
        let candidate = AllowedRoots.join(resolvedDirectory, name)
        var info = stat()
        guard lstat(candidate, &info) == 0, info.st_mode & S_IFMT != S_IFLNK else { return inspect(path) }
        return check(candidate, info)
    }

    /// The checks once a path is resolved: inside the roots, a regular file, readable.
    private func check(_ resolved: String, _ info: stat) -> Result<FileInfo, FileAccessError> {
        guard contains(resolvedPath: resolved) else { return .failure(.outsideAllowedRoots) }
        switch info.st_mode & S_IFMT {
        case S_IFREG: break
        case S_IFDIR: return .failure(.isDirectory)
        default: return .failure(.notRegularFile)
        }
        guard access(resolved, R_OK) == 0 else { return .failure(.notReadable) }
        return .success(
            FileInfo(
                path: resolved, size: Int64(info.st_size), modifiedAtNanoseconds: info.modifiedNanoseconds,
                identity: info.identity))
    }
}

/// Directories already resolved for one request's files (`AllowedRoots.inspect(_:directories:)`).
public struct ResolvedDirectories {
    fileprivate var resolved: [String: String] = [:]

    public init() {}
}

extension AllowedRoots {
    /// An absolute path's directory (`/` for a name at the root) and its last component; nil
    /// when there is no name to take (not absolute, a trailing `/`, `.` or `..`).
    static func split(_ path: String) -> (directory: String, name: Substring)? {
        guard path.hasPrefix("/"), let slash = path.lastIndex(of: "/") else { return nil }
        let name = path[path.index(after: slash)...]
        guard !name.isEmpty, name != ".", name != ".." else { return nil }
        return (slash == path.startIndex ? "/" : String(path[..<slash]), name)
    }

    /// `name` in the resolved `directory`.
    static func join(_ directory: String, _ name: Substring) -> String { (directory == "/" ? "" : directory) + "/" + name }
}

extension AllowedRoots {
    /// Checks a download's destination: its directory exists inside the roots and can be
    /// written, and nothing is there unless `overwrite`. Returns the path with the directory
    /// resolved (the task keeps that path, walked again beneath its root: `Beneath`).
    public func inspectDestination(_ path: String, overwrite: Bool) -> Result<String, FileAccessError> {
        guard path.hasPrefix("/") else { return .failure(.notAbsolute) }
        guard let (directory, name) = AllowedRoots.split(path) else { return .failure(.isDirectory) }
        guard let resolvedDirectory = AllowedRoots.realPath(directory) else {
            return .failure(
                contains(resolvedPath: AllowedRoots.resolveExistingPrefix(directory)) ? .directoryNotFound : .outsideAllowedRoots)
        }
        let resolved = AllowedRoots.join(resolvedDirectory, name)
        guard contains(resolvedPath: resolved) else { return .failure(.outsideAllowedRoots) }
        var info = stat()
        guard stat(resolvedDirectory, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else { return .failure(.directoryNotFound) }
        guard access(resolvedDirectory, W_OK) == 0 else { return .failure(.notWritable) }
        if lstat(resolved, &info) == 0 {
            switch info.st_mode & S_IFMT {
            case S_IFDIR: return .failure(.isDirectory)
            case S_IFREG: if !overwrite { return .failure(.destinationExists) }
            default: return .failure(.notRegularFile)
            }
        }
        return .success(resolved)
    }
}

extension stat {
    public var modifiedNanoseconds: Int64 { Int64(st_mtim.tv_sec) * 1_000_000_000 + Int64(st_mtim.tv_nsec) }
}

/// A file opened for one upload attempt, read through its descriptor only.
public final class OpenedFile {
    public let descriptor: Int32
    public let info: FileInfo
    private let roots: AllowedRoots
    /// The descriptor's device and inode, which never change.
    private let identity: FileIdentity

    /// Opens the recorded path, walked beneath its allowed root with no symbolic link (`Beneath`),
    /// and checks it is still the file recorded at enqueue: the same device and inode (when
    /// recorded), size and modification time.
    public static func open(_ expected: FileInfo, roots: AllowedRoots) -> Result<OpenedFile, TaskError> {
        let descriptor: Int32
        switch Beneath.open(expected.path, roots: roots, flags: O_RDONLY) {
        case .success(let opened): descriptor = opened
        case .failure(let error): return .failure(error.taskError)
        }
        var now = stat()
        guard fstat(descriptor, &now) == 0 else {
            close(descriptor)
            return .failure(TaskError(.fileDoesNotExist, message: "cannot stat the file"))
        }
        let file = OpenedFile(descriptor: descriptor, info: expected, roots: roots, identity: now.identity)
        if let error = file.checkIdentity() ?? file.unchanged(now) { return .failure(error) }
        return .success(file)
    }

    private init(descriptor: Int32, info: FileInfo, roots: AllowedRoots, identity: FileIdentity) {
        self.descriptor = descriptor
        self.info = info
        self.roots = roots
        self.identity = identity
    }

    deinit { close(descriptor) }

    /// nil when the descriptor is the file recorded at enqueue (device and inode), or nothing was
    /// recorded.
    private func checkIdentity() -> TaskError? {
        guard let expected = info.identity else { return nil }
        return roots.isRecorded(expected, identity, at: info.path)
            ? nil : Beneath.WalkError.swapped("the name now leads to another file").taskError
    }

    /// nil when size and modification time still match the enqueue-time record.
    public func checkUnchanged() -> TaskError? {
        var now = stat()
        guard fstat(descriptor, &now) == 0 else { return TaskError(.fileDoesNotExist, message: "cannot stat the file") }
        return unchanged(now)
    }

    /// `checkUnchanged` on what `fstat` gave.
    private func unchanged(_ now: stat) -> TaskError? {
        guard now.st_mode & S_IFMT == S_IFREG else {
            return TaskError(.fileChanged, message: "the path is no longer a regular file")
        }
        if Int64(now.st_size) != info.size || now.modifiedNanoseconds != info.modifiedAtNanoseconds {
            return TaskError(.fileChanged, message: "the file changed after it was enqueued (size or modification time)")
        }
        return nil
    }

    /// At the end of an upload: nil when the file is unchanged and its path, walked again from the
    /// root, still leads to this descriptor's file.
    public func checkUnchangedAtPath() -> TaskError? {
        if let changed = checkUnchanged() { return changed }
        switch Beneath.look(at: info.path, roots: roots) {
        case .success(let found) where found.identity == identity: return nil
        case .success: return Beneath.WalkError.swapped("the name no longer leads to the file that was read").taskError
        case .failure(let error): return error.taskError
        }
    }

    /// Reads at `offset` into `buffer` (`pread`); the count, 0 at end of file, -1 on error.
    public func read(at offset: Int64, into buffer: UnsafeMutableRawBufferPointer) -> Int {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return 0 }
        while true {
            let count = pread(descriptor, base, buffer.count, off_t(offset))
            if count < 0 && errno == EINTR { continue }
            return count
        }
    }
}

/// Small settings files (config, tokens, the routing table) read whole.
public enum SmallFile {
    /// The file's first `limit` bytes (at most), nil when it cannot be opened.
    public static func read(_ path: String, limit: Int = 1 << 20) -> [UInt8]? {
        guard let file = fopen(path, "r") else { return nil }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while bytes.count < limit {
            let count = fread(&buffer, 1, min(buffer.count, limit - bytes.count), file)
            if count <= 0 { break }
            bytes += buffer[0..<count]
        }
        return bytes
    }
}
