import JSONValue

/// The file at enqueue: its resolved path, size and modification time (nanoseconds).
public struct FileInfo: Sendable, Equatable {
    public var path: String
    public var size: Int64
    public var modifiedAtNanoseconds: Int64

    public init(path: String, size: Int64, modifiedAtNanoseconds: Int64) {
        self.path = path
        self.size = size
        self.modifiedAtNanoseconds = modifiedAtNanoseconds
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
