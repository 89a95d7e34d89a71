import BackhaulCore
import BackhaulQueue
import SQLite

extension StoreError {
    /// Maps what a write threw to the store's terms.
    init(_ error: any Error) {
        switch error {
        case let error as StoreError: self = error
        case let error as ValidationError: self = .invalid(error)
        case let error as SQLiteError where error.isStorageFull: self = .storageFull
        default: self = .database(String(describing: error))
        }
    }
}

extension Store: StateStore {
    public func nodes() -> [NodeRecord]? { nil }
}
