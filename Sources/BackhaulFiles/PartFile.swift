import BackhaulCore
import Digest
import Glibc

/// A download's `.part` file, written through its descriptor only, then verified and renamed
/// into place. Used from one thread at a time: the engine's, which hands it to its download
/// verifier (sync and read-back only) while it waits.
public final class PartFile {
    public let path: String
    private let descriptor: Int32
    private var position: Int64 = 0
    /// `errno` of the last write that failed.
    public private(set) var lastError: Int32 = 0

    /// The last write failed because the file system (or the quota) is full.
    public var isOutOfSpace: Bool { lastError == ENOSPC || lastError == EDQUOT }

    /// Opens (creating) the `.part` file; a symbolic link there is refused, not followed.
    public static func open(_ path: String) -> Result<PartFile, TaskError> {
        let descriptor = Glibc.open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            let reason = String(cString: strerror(errno))
            return .failure(TaskError(.cannotCreateFile, message: "cannot open \(path): \(reason)"))
        }
        return .success(PartFile(path: path, descriptor: descriptor))
    }

    private init(path: String, descriptor: Int32) {
        self.path = path
        self.descriptor = descriptor
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

    /// Moves the finished (and synced) file to `destination` in one step: `rename` when it may
    /// replace a file there, else `link` + `unlink` (which fails rather than replace). The
    /// directory is synced so the new name survives a power cut.
    public func place(at destination: String, overwrite: Bool) -> TaskError? {
        if overwrite {
            guard rename(path, destination) == 0 else {
                return TaskError(.cannotMoveFile, message: "cannot rename to \(destination): \(String(cString: strerror(errno)))")
            }
        } else {
            guard link(path, destination) == 0 else {
                let reason = errno == EEXIST ? "a file appeared there and overwrite is false" : String(cString: strerror(errno))
                return TaskError(.cannotMoveFile, message: "cannot move the download to \(destination): \(reason)")
            }
            unlink(path)
        }
        let directory = String(destination[..<(destination.lastIndex(of: "/") ?? destination.startIndex)])
        let handle = Glibc.open(directory.isEmpty ? "/" : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if handle >= 0 {
            fsync(handle)
            close(handle)
        }
        return nil
    }
}
