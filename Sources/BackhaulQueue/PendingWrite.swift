import BackhaulCore
import Threads

/// A write's answer, waited for by the thread that handed it over.
public final class PendingWrite<T>: @unchecked Sendable {
    package init() {}

    // @unchecked: `value` is written on the writer thread before `finish`, read after `wait`.
    package var value: T?
    private let state = Locked<(done: Bool, error: StoreError?)>((false, nil))

    package func finish(_ error: StoreError?) {
        state.withLockNotifyingAll { $0 = (true, error) }
    }

    /// Waits for the commit (or the failure): the result, durable as the write asked.
    public func wait() throws(StoreError) -> T {
        let error = state.wait(until: { $0.done }, timeout: 1e9) { $0.error }
        if let error { throw error }
        guard let value else { throw StoreError.database("a write ended without a result") }
        return value
    }
}
