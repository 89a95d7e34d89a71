import BackhaulCore

/// What the store refuses, in the API's terms.
public enum StoreError: Error, Sendable, Equatable {
    case notFound
    case sessionExists
    case conflict(String)
    /// The state directory is full: nothing was written.
    case storageFull
    /// A change the caller applied inside the transaction refused the record: nothing was written.
    case invalid(ValidationError)
    /// The session already holds `open` unfinished tasks and may hold at most `limit`.
    case tooManyTasks(open: Int, limit: Int)
    /// A stored record cannot be read back: the database was changed outside this program, or by
    /// a build that wrote what this one does not understand. Never replaced by a default.
    case corrupt(String)
    /// The database was written by a newer build (its schema version is above this build's).
    case newerSchema(found: Int, supported: Int)
    /// A sync of the state failed: the write may not be on disk, and the store has failed closed
    /// (`StoreWriter`).
    case syncFailed(SyncFailure)
    /// The state's database cannot be reached now (PostgreSQL gone away): nothing was written,
    /// and the same write may succeed later.
    case unavailable(String)
    case database(String)
}
