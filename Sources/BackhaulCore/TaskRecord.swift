import JSONValue

/// Which way a task moves its file.
public enum TaskKind: String, Sendable, CaseIterable {
    case upload, download
}

/// A task as stored: everything needed to run it and to show it.
///
/// A value with copy-on-write storage: a record is handed along a task's whole path (decoded, checked,
/// applied a transition, kept by its transfer beside the record it started from), and copying its
/// thirty fields, two dozen of them counted references, took 20 copies and about 18,000
/// instructions a task. A copy is now one reference; the fields are copied when a shared record is
/// changed.
public struct TaskRecord: Sendable, Equatable {
    /// The stored fields, as one value (documented where they are read, below).
    @usableFromInline
    struct Fields: Sendable, Equatable {
        @usableFromInline var id: String
        @usableFromInline var sequence: Int64 = 0
        @usableFromInline var sessionID: String
        @usableFromInline var kind: TaskKind = .upload
        @usableFromInline var state: TaskState = .queued
        @usableFromInline var waitingReason: WaitingReason?
        @usableFromInline var file: FileInfo
        @usableFromInline var request: RequestSpec
        @usableFromInline var upload: UploadSpec
        @usableFromInline var priority: Double = 0.5
        @usableFromInline var description: String?
        @usableFromInline var idempotencyKey: String?
        @usableFromInline var deleteFileOnSuccess: Bool = false
        @usableFromInline var configurationOverrides: JSONObject = [:]
        @usableFromInline var attempts: Int = 0
        @usableFromInline var bytesTransferred: Int64 = 0
        @usableFromInline var createdAt: Timestamp
        @usableFromInline var startedAt: Timestamp?
        @usableFromInline var finishedAt: Timestamp?
        @usableFromInline var nextAttemptAt: Timestamp?
        @usableFromInline var earliestBeginAt: Timestamp?
        @usableFromInline var deadlineAt: Timestamp
        @usableFromInline var response: ResponseRecord?
        @usableFromInline var error: TaskError?
        @usableFromInline var lastError: LastError?
        @usableFromInline var cancellation: CancellationReason?
        @usableFromInline var checkpoint: TransferCheckpoint?
        @usableFromInline var download: DownloadSpec?
        @usableFromInline var node: String?
        @usableFromInline var revision: Int64 = 0
    }

    /// The fields behind a reference; changed only while this record holds the only reference.
    /// Every access to a record reads or writes these fields: the runtime's exclusivity check of a
    /// class property (two calls an access, 50 a task) is left out; the record's own accesses are
    /// still checked where it is stored, and every write goes through `fields`, which copies them
    /// first when they are shared.
    @usableFromInline
    final class Storage: @unchecked Sendable {
        @usableFromInline @exclusivity(unchecked) var fields: Fields
        @usableFromInline init(_ fields: Fields) { self.fields = fields }
    }

    @usableFromInline var storage: Storage

    /// The fields for changing: copied first when another record shares them.
    @usableFromInline var fields: Fields {
        @inlinable _read { yield storage.fields }
        @inlinable _modify {
            if !isKnownUniquelyReferenced(&storage) { storage = Storage(storage.fields) }
            yield &storage.fields
        }
    }

    public init(
        id: String, sessionID: String, file: FileInfo, request: RequestSpec, upload: UploadSpec,
        createdAt: Timestamp, deadlineAt: Timestamp
    ) {
        storage = Storage(
            Fields(
                id: id, sessionID: sessionID, file: file, request: request, upload: upload, createdAt: createdAt,
                deadlineAt: deadlineAt))
    }

    public static func == (lhs: TaskRecord, rhs: TaskRecord) -> Bool {
        lhs.storage === rhs.storage || lhs.storage.fields == rhs.storage.fields
    }
}

extension TaskRecord {
    @inlinable public var id: String {
        _read { yield storage.fields.id }
        _modify { yield &fields.id }
    }

    @inlinable public var sequence: Int64 {
        _read { yield storage.fields.sequence }
        _modify { yield &fields.sequence }
    }

    @inlinable public var sessionID: String {
        _read { yield storage.fields.sessionID }
        _modify { yield &fields.sessionID }
    }

    @inlinable public var kind: TaskKind {
        _read { yield storage.fields.kind }
        _modify { yield &fields.kind }
    }

    @inlinable public var state: TaskState {
        _read { yield storage.fields.state }
        _modify { yield &fields.state }
    }

    @inlinable public var waitingReason: WaitingReason? {
        _read { yield storage.fields.waitingReason }
        _modify { yield &fields.waitingReason }
    }

    @inlinable public var file: FileInfo {
        _read { yield storage.fields.file }
        _modify { yield &fields.file }
    }

    @inlinable public var request: RequestSpec {
        _read { yield storage.fields.request }
        _modify { yield &fields.request }
    }

    @inlinable public var upload: UploadSpec {
        _read { yield storage.fields.upload }
        _modify { yield &fields.upload }
    }

    @inlinable public var priority: Double {
        _read { yield storage.fields.priority }
        _modify { yield &fields.priority }
    }

    @inlinable public var description: String? {
        _read { yield storage.fields.description }
        _modify { yield &fields.description }
    }

    @inlinable public var idempotencyKey: String? {
        _read { yield storage.fields.idempotencyKey }
        _modify { yield &fields.idempotencyKey }
    }

    @inlinable public var deleteFileOnSuccess: Bool {
        _read { yield storage.fields.deleteFileOnSuccess }
        _modify { yield &fields.deleteFileOnSuccess }
    }

    /// The task's own configuration overrides, as given (applied over the session's).
    @inlinable public var configurationOverrides: JSONObject {
        _read { yield storage.fields.configurationOverrides }
        _modify { yield &fields.configurationOverrides }
    }

    @inlinable public var attempts: Int {
        _read { yield storage.fields.attempts }
        _modify { yield &fields.attempts }
    }

    @inlinable public var bytesTransferred: Int64 {
        _read { yield storage.fields.bytesTransferred }
        _modify { yield &fields.bytesTransferred }
    }

    @inlinable public var createdAt: Timestamp {
        _read { yield storage.fields.createdAt }
        _modify { yield &fields.createdAt }
    }

    @inlinable public var startedAt: Timestamp? {
        _read { yield storage.fields.startedAt }
        _modify { yield &fields.startedAt }
    }

    @inlinable public var finishedAt: Timestamp? {
        _read { yield storage.fields.finishedAt }
        _modify { yield &fields.finishedAt }
    }

    @inlinable public var nextAttemptAt: Timestamp? {
        _read { yield storage.fields.nextAttemptAt }
        _modify { yield &fields.nextAttemptAt }
    }

    @inlinable public var earliestBeginAt: Timestamp? {
        _read { yield storage.fields.earliestBeginAt }
        _modify { yield &fields.earliestBeginAt }
    }

    /// When the resource timeout ends the task.
    @inlinable public var deadlineAt: Timestamp {
        _read { yield storage.fields.deadlineAt }
        _modify { yield &fields.deadlineAt }
    }

    @inlinable public var response: ResponseRecord? {
        _read { yield storage.fields.response }
        _modify { yield &fields.response }
    }

    @inlinable public var error: TaskError? {
        _read { yield storage.fields.error }
        _modify { yield &fields.error }
    }

    /// The error of the latest failed attempt (OpenAPI/backhaul.yaml), kept after the task ends.
    @inlinable public var lastError: LastError? {
        _read { yield storage.fields.lastError }
        _modify { yield &fields.lastError }
    }

    @inlinable public var cancellation: CancellationReason? {
        _read { yield storage.fields.cancellation }
        _modify { yield &fields.cancellation }
    }

    /// A resumable protocol's progress (what the server acknowledged; for a download, what is
    /// durably in the `.part` file).
    @inlinable public var checkpoint: TransferCheckpoint? {
        _read { yield storage.fields.checkpoint }
        _modify { yield &fields.checkpoint }
    }

    /// A download's destination (nil for uploads).
    @inlinable public var download: DownloadSpec? {
        _read { yield storage.fields.download }
        _modify { yield &fields.download }
    }

    /// The node of the fleet the task is pinned to, its file being on that node's own disk
    /// (docs/fleet.md); nil when any node may run it, and always with one daemon on SQLite.
    @inlinable public var node: String? {
        _read { yield storage.fields.node }
        _modify { yield &fields.node }
    }

    /// The row's version in a store that keeps one (PostgreSQL, where every change to a task's
    /// row counts one up), so that a node may write its copy of a task back without reading the
    /// row again when no one changed it meanwhile (docs/fleet.md); always 0 in SQLite, where one
    /// writer owns every row. Not part of the task's JSON.
    @inlinable public var revision: Int64 {
        _read { yield storage.fields.revision }
        _modify { yield &fields.revision }
    }
}
