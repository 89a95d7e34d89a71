import BackhaulCore
import BackhaulQueue
import Threads

/// A task of the session "s" whose file is under `/d` (the tests' shared root).
func makeTask(_ id: String, now: Timestamp) -> TaskRecord {
    TaskRecord(
        id: id, sessionID: "s", file: FileInfo(path: "/d/\(id)", size: 10, modifiedAtNanoseconds: 1),
        request: RequestSpec(url: "http://h/\(id)", method: "PUT"), upload: UploadSpec(), createdAt: now,
        deadlineAt: now + 86_400)
}

/// Waits for the answer of a write handed over with a callback.
func answer<T: Sendable>(_ start: (@escaping @Sendable (Result<T, StoreError>) -> Void) -> Void) throws -> T {
    let box = Locked<Result<T, StoreError>?>(nil)
    start { result in box.withLockNotifyingAll { $0 = result } }
    guard let result = box.wait(until: { $0 != nil }, timeout: 10, { $0 }) else { throw StoreError.database("no answer in 10 s") }
    return try result.get()
}
