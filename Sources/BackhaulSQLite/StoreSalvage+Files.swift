import BackhaulQueue
import Glibc

/// The salvage's file work: a truncated file grown back, copies, durable small files.
extension StoreSalvage {
    /// A copy of the database at `path` (and of its WAL) grown to the page count its header
    /// gives, beside it; nil when the file is not shorter than that (or has no valid header).
    static func paddedCopy(of path: String) throws -> String? {
        guard let header = readBytes(path, count: 100), header.count == 100,
            header.starts(with: Array("SQLite format 3".utf8) + [0])
        else { return nil }
        let pageSize = header[16] == 0 && header[17] == 1 ? 65_536 : Int(header[16]) << 8 | Int(header[17])
        let pages = header[28..<32].reduce(0) { $0 << 8 | Int($1) }
        var status = stat()
        guard stat(path, &status) == 0, Int(status.st_size) < pages * pageSize else { return nil }
        let copy = parentDirectory(of: path) + "/salvage-read.db"
        for ending in ["", "-wal"] where access(path + ending, F_OK) == 0 {
            try copyFile(path + ending, to: copy + ending)
        }
        guard truncate(copy, off_t(pages * pageSize)) == 0 else {
            throw StoreError.database("cannot grow \(copy): \(String(cString: strerror(errno)))")
        }
        return copy
    }

    /// Removes a database built or copied by a salvage, with its journals.
    static func removeDatabase(at path: String) {
        for ending in ["", "-journal", "-wal", "-shm"] { unlink(path + ending) }
    }

    /// Removes a `corrupt-*` directory this salvage made and filled with links only.
    static func removeFolder(_ folder: String) {
        for name in entries(of: folder) { unlink(folder + "/" + name) }
        rmdir(folder)
    }

    /// The names in `directory` (without `.` and `..`); none when it cannot be read.
    static func entries(of directory: String) -> [String] {
        guard let stream = opendir(directory) else { return [] }
        defer { closedir(stream) }
        var names: [String] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            if name != ".", name != ".." { names.append(name) }
        }
        return names
    }

    /// Syncs the file at `path` to the disk.
    static func syncFile(_ path: String) throws {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw StoreError.database("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        guard fsync(descriptor) == 0 else {
            throw StoreError.database("cannot sync \(path): \(String(cString: strerror(errno)))")
        }
    }

    static func readBytes(_ path: String, count: Int) -> [UInt8]? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var bytes = [UInt8](repeating: 0, count: count)
        let read = pread(descriptor, &bytes, count, 0)
        return read < 0 ? nil : Array(bytes[0..<read])
    }

    static func copyFile(_ source: String, to target: String) throws {
        let input = open(source, O_RDONLY | O_CLOEXEC)
        let output = open(target, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        defer {
            if input >= 0 { close(input) }
            if output >= 0 { close(output) }
        }
        guard input >= 0, output >= 0 else {
            throw StoreError.database("cannot copy \(source): \(String(cString: strerror(errno)))")
        }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let count = read(input, &buffer, buffer.count)
            guard count > 0 else {
                if count < 0 { throw StoreError.database("cannot read \(source): \(String(cString: strerror(errno)))") }
                return
            }
            guard write(output, buffer, count) == count else {
                throw StoreError.database("cannot write \(target): \(String(cString: strerror(errno)))")
            }
        }
    }

    static func parentDirectory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    static func baseName(of path: String) -> String {
        path.lastIndex(of: "/").map { String(path[path.index(after: $0)...]) } ?? path
    }

    static func readText(_ path: String) -> String? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while bytes.count < 1 << 20 {
            let count = read(descriptor, &buffer, buffer.count)
            guard count > 0 else { break }
            bytes += buffer[0..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    static func writeDurably(_ text: String, to path: String) throws {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw StoreError.database("cannot write \(path): \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        let bytes = Array(text.utf8)
        guard write(descriptor, bytes, bytes.count) == bytes.count, fsync(descriptor) == 0 else {
            throw StoreError.database("cannot write \(path): \(String(cString: strerror(errno)))")
        }
        if let failure = syncDirectory(of: path) { throw StoreError.syncFailed(failure) }
    }
}
