import BackhaulCore
import Digest
import Glibc

/// A download's `.part` file, written through its descriptor only, then verified and renamed
/// into place. It lives in the destination's directory, held open beneath its allowed root
/// (`Beneath`): it is made, placed and removed through that descriptor, so a directory swapped for
/// a symbolic link later is never written through. Used from one thread at a time: the engine's,
/// which hands it to its download verifier (sync and read-back only) while it waits.
public final class PartFile {
    public let path: String
    private let descriptor: Int32
    private let directory: Beneath.Directory
    private let roots: AllowedRoots
    private var partName: String { directory.name + ".part" }
    private var position: Int64 = 0
    /// `errno` of the last write that failed.
    public private(set) var lastError: Int32 = 0

    /// The last write failed because the file system (or the quota) is full.
    public var isOutOfSpace: Bool { lastError == ENOSPC || lastError == EDQUOT }

    /// Opens the `.part` file of the download to `destination`, in its directory walked beneath
    /// the allowed root. When `resuming` it opens the one there (or makes it, should it be gone);
    /// otherwise it makes a new one with `O_CREAT | O_EXCL`, removing a stale one first. A symbolic
    /// link there is refused, not followed.
    public static func open(destination: String, roots: AllowedRoots, resuming: Bool) -> Result<PartFile, TaskError> {
        let directory: Beneath.Directory
        switch Beneath.parent(of: destination, roots: roots) {
        case .success(let found): directory = found
        case .failure(let error): return .failure(error.taskError)
        }
        let name = directory.name + ".part"
        var descriptor: Int32 = -1
        if resuming { descriptor = openat(directory.descriptor, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC) }
        if descriptor < 0 {
            if !resuming, let stale = directory.statName(name), stale.st_mode & S_IFMT == S_IFREG {
                unlinkat(directory.descriptor, name, 0)
            }
            descriptor = openat(directory.descriptor, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644)
        }
        guard descriptor >= 0 else {
            let reason = String(cString: strerror(errno))
            return .failure(TaskError(.cannotCreateFile, message: "cannot open \(destination).part: \(reason)"))
        }
        return .success(PartFile(path: destination + ".part", descriptor: descriptor, directory: directory, roots: roots))
    }

    private init(path: String, descriptor: Int32, directory: Beneath.Directory, roots: AllowedRoots) {
        self.path = path
        self.descriptor = descriptor
        self.directory = directory
        self.roots = roots
    }

    deinit { close(descriptor) }

    /// Cuts the file to `offset` (dropping bytes written after the last durable checkpoint) and
    /// continues writing there.
    public func truncate(at offset: Int64) -> Bool {
        guard ftruncate(descriptor, off_t(offset)) == 0 else {
            lastError = errno
            return false
        }
        position = offset
        return true
    }

    public func write(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var done = 0
        while done < bytes.count {
            let count = pwrite(descriptor, bytes.baseAddress! + done, bytes.count - done, off_t(position))
            if count < 0 {
                if errno == EINTR { continue }
                lastError = errno
                return false
            }
            done += count
            position += Int64(count)
        }
        return true
    }

    public func sync() -> Bool { fdatasync(descriptor) == 0 }

    public var size: Int64 {
        var info = stat()
        return fstat(descriptor, &info) == 0 ? Int64(info.st_size) : -1
    }

    /// Whether the file system has `bytes` more free for an unprivileged writer.
    public func hasRoom(for bytes: Int64) -> Bool {
        var info = statvfs()
        guard fstatvfs(descriptor, &info) == 0 else { return true }
        return Int64(info.f_bavail) * Int64(info.f_frsize) >= bytes
    }

    /// The SHA-256 of the whole file, lower-case hex.
    public func sha256() -> String? {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }
        let hasher = SHA256Hasher()
        var offset: Int64 = 0
        while true {
            let count = pread(descriptor, buffer.baseAddress, buffer.count, off_t(offset))
            if count < 0 {
                if errno == EINTR { continue }
                return nil
            }
            if count == 0 { break }
            hasher.update(UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
            offset += Int64(count)
        }
        return SHA256Hasher.hex(hasher.finish())
    }

    /// nil while the destination's path, walked again from its root, still leads to the directory
    /// this file was made in; else the task's `path_changed` error (and the download must not be
    /// placed: `discard` it).
    public func checkPath() -> TaskError? {
        switch Beneath.parent(of: directory.path, roots: roots) {
        case .success(let now):
            return now.isSame(as: directory)
                ? nil : Beneath.WalkError.swapped("the destination's directory was replaced").taskError
        case .failure(let error):
            return error == .missing
                ? Beneath.WalkError.swapped("the destination's directory is gone").taskError : error.taskError
        }
    }

    /// Removes the `.part` file through the held directory (a download that ends without completing).
    public func discard() { unlinkat(directory.descriptor, partName, 0) }

    /// Moves the finished (and synced) file to the destination in one step, within the held
    /// directory and only while its path still leads there: `renameat` when it may replace a file
    /// there, else `linkat` + `unlinkat` (which fails rather than replace). The directory is synced
    /// so the new name survives a power cut.
    public func place(overwrite: Bool) -> TaskError? {
        if let moved = checkPath() { return moved }
        let held = directory.descriptor
        if overwrite {
            guard renameat(held, partName, held, directory.name) == 0 else {
                return TaskError(
                    .cannotMoveFile, message: "cannot rename to \(directory.path): \(String(cString: strerror(errno)))")
            }
        } else {
            guard linkat(held, partName, held, directory.name, 0) == 0 else {
                let reason = errno == EEXIST ? "a file appeared there and overwrite is false" : String(cString: strerror(errno))
                return TaskError(.cannotMoveFile, message: "cannot move the download to \(directory.path): \(reason)")
            }
            unlinkat(held, partName, 0)
        }
        fsync(held)
        return nil
    }
}
