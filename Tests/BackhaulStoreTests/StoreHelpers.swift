import BackhaulCore
import SQLite
import Testing
import Threads

@testable import BackhaulPostgres
@testable import BackhaulQueue
@testable import BackhaulSQLite

/// The engine's store calls hand their answer to a callback on the writer's thread; tests wait
/// for it.
func waitFor<T: Sendable>(_ start: (@escaping @Sendable (Result<T, StoreError>) -> Void) -> Void) throws -> T {
    let box = Locked<Result<T, StoreError>?>(nil)
    start { result in box.withLockNotifyingAll { $0 = result } }
    guard let result = box.wait(until: { $0 != nil }, timeout: 10, { $0 }) else { throw StoreError.database("no answer in 10 s") }
    return try result.get()
}

extension StateStore {
    /// Claims a queued task as the engine does (reading it first).
    func startAttempt(id: String) throws -> TaskRecord? {
        guard let task = try task(id: id) else { return nil }
        return try waitFor { done in startAttempt(task, done: done) }
    }

    func finishAttempt(id: String, attempt: Int, bytesTransferred: Int64, result: AttemptEnd) throws -> TaskRecord? {
        guard let task = try task(id: id) else { return nil }
        let now = SystemClock().now()
        let history = AttemptRecord(
            startedAt: now, endedAt: now, bytesTransferred: bytesTransferred, bytesReceived: 0, outcome: result.outcome)
        var started = task
        started.attempts = attempt
        started.state = .running
        return try waitFor { done in
            finishAttempt(started, bytesTransferred: bytesTransferred, end: result, history: history, done: done)
        }
    }

    func requeueRunning(except running: Set<String>) throws -> Int {
        try waitFor { done in requeueRunning(except: running, done: done) }
    }

    func fireTimers(now: Timestamp) throws -> (expired: Int, next: Timestamp?) {
        try waitFor { done in fireTimers(now: now, done: done) }
    }

    /// Hands the store's writer a job of the test's own, run in the writer's transaction with
    /// `run` executing a statement: to hold the writer, to fail the jobs' batch, to write beside
    /// another job.
    func submitJob(
        _ body: @escaping (_ run: (String) throws -> Void) throws -> Void,
        done: @escaping (Result<Void, StoreError>) -> Void = { _ in }
    ) {
        switch self {
        case let store as Store: store.submit({ db in try body { try db.run($0) } }, done: done)
        case let store as PostgresStore: store.submit({ tx in try body { try tx.execute($0) } }, done: done)
        default: Issue.record("no writer to hand a job in \(type(of: self))")
        }
    }

    /// Waits until every write handed over so far has committed.
    func settle() throws {
        switch self {
        case let store as Store: try store.write(.relaxed) { _ in () }
        case let store as PostgresStore: try store.settle()
        default: Issue.record("no way to settle \(type(of: self))")
        }
    }
}
