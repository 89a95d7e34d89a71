import JSONValue

/// The file at enqueue: its resolved path, size, modification time (nanoseconds) and identity.
public struct FileInfo: Sendable, Equatable {
    public var path: String
    public var size: Int64
    public var modifiedAtNanoseconds: Int64
    /// Device and inode at enqueue (docs/security.md): a resume, a reopen and a removal act only on
    /// the same file. nil for a task enqueued before they were recorded, and for downloads.
    public var identity: FileIdentity?

    public init(path: String, size: Int64, modifiedAtNanoseconds: Int64, identity: FileIdentity? = nil) {
        self.path = path
        self.size = size
        self.modifiedAtNanoseconds = modifiedAtNanoseconds
        self.identity = identity
    }

    public func writeJSON(to writer: inout JSONWriter) {
        writer.object { object in
            object.key("path")
            object.string(path)
            object.key("size")
            object.int(size)
            object.key("modified_at")
            object.timestamp(Double(modifiedAtNanoseconds) / 1e9)
        }
    }
}

/// Which file a name leads to: `st_dev` and `st_ino`.
public struct FileIdentity: Sendable, Hashable {
    public var device: UInt64
    public var inode: UInt64

    public init(device: UInt64, inode: UInt64) {
        self.device = device
        self.inode = inode
    }

    /// As stored: `{"device", "inode"}` (each the 64 bits as a signed integer).
    public func writeJSON(to writer: inout JSONWriter) {
        writer.object { object in
            object.key("device")
            object.int(Int64(bitPattern: device))
            object.key("inode")
            object.int(Int64(bitPattern: inode))
        }
    }

    public init?(_ value: JSON) {
        guard let device = value["device"]?.intValue, let inode = value["inode"]?.intValue else { return nil }
        self.init(device: UInt64(bitPattern: device), inode: UInt64(bitPattern: inode))
    }
}

/// A file the store lets go once the commit that ended its task is durable: a completed upload's
/// source (`delete_file_on_success`), or the `.part` file of a download that ended without
/// completing. The store hands these to a `FileRemover`; the server's removes them through
/// directory descriptors beneath the allowed roots (BackhaulFiles `FileRemoval`).
public struct FileToRemove: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// The upload's file, removed only while its name still leads to `file.identity`.
        case uploadedFile
        /// The `.part` file beside the download's destination, `file.path`.
        case downloadPart
    }

    public var taskID: String
    public var file: FileInfo
    public var kind: Kind

    public init(taskID: String, file: FileInfo, kind: Kind) {
        self.taskID = taskID
        self.file = file
        self.kind = kind
    }

    /// A completed upload's file.
    public static func uploadedFile(of task: TaskRecord) -> FileToRemove {
        FileToRemove(taskID: task.id, file: task.file, kind: .uploadedFile)
    }

    /// What a removal that failed does to the task: it shows as its `last_error` (`-3004
    /// cannot_remove_file`); the task keeps its state.
    public static func notRemoved(_ task: TaskRecord, _ error: TaskError, at now: Timestamp) -> TaskRecord {
        var noted = task
        noted.lastError = LastError(error, at: now)
        return noted
    }

    /// The `.part` file of a download (`task.file.path` is its destination).
    public static func downloadPart(of task: TaskRecord) -> FileToRemove {
        FileToRemove(taskID: task.id, file: task.file, kind: .downloadPart)
    }
}

/// Removes what a committed batch let go (`FileToRemove`); called on the store writer's thread
/// after the commit, so it must not wait for the store.
public protocol FileRemover: Sendable {
    func remove(_ files: [FileToRemove])
}
