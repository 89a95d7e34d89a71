import Glibc

/// A value behind a pthread mutex, with a condition variable for waiting on changes.
///
/// Used instead of `Synchronization.Mutex`: on Linux that lock is built on raw futex calls,
/// which ThreadSanitizer does not model, so every access it protects is reported as a race
/// and real races drown. pthread locks are intercepted by TSan.
public final class Locked<Value>: @unchecked Sendable {
    // @unchecked: `value` is only touched while `mutex` is held.
    private var value: Value
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>

    public init(_ value: Value) {
        self.value = value
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(condition)
        condition.deallocate()
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `body` with the value, holding the lock.
    public func withLock<T, E: Error>(_ body: (inout Value) throws(E) -> T) throws(E) -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }

    /// Waits (without a time limit) until `ready` holds, then runs `body` holding the lock. Only
    /// for conditions a holder makes true soon after, under `withLockNotifyingAll`.
    public func withLock<T, E: Error>(when ready: (Value) -> Bool, _ body: (inout Value) throws(E) -> T) throws(E) -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        while !ready(value) { pthread_cond_wait(condition, mutex) }
        return try body(&value)
    }

    /// Changes the value and wakes every waiter.
    public func withLockNotifyingAll<T>(_ body: (inout Value) -> T) -> T {
        pthread_mutex_lock(mutex)
        defer {
            pthread_cond_broadcast(condition)
            pthread_mutex_unlock(mutex)
        }
        return body(&value)
    }

    /// Changes the value and wakes every waiter when `body` says so (a waiter woken for nothing
    /// costs it a context switch).
    public func withLockNotifyingAllIfNeeded<T>(_ body: (inout Value) -> (T, notify: Bool)) -> T {
        pthread_mutex_lock(mutex)
        let (result, notify) = body(&value)
        if notify { pthread_cond_broadcast(condition) }
        pthread_mutex_unlock(mutex)
        return result
    }

    /// Waits until `ready` holds or `timeout` seconds pass; then runs `body` under the lock.
    public func wait<T>(until ready: (Value) -> Bool, timeout: Double, _ body: (inout Value) -> T) -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        var deadline = timespec()
        clock_gettime(CLOCK_MONOTONIC, &deadline)
        let whole = Int(timeout)
        deadline.tv_sec += whole
        deadline.tv_nsec += Int((timeout - Double(whole)) * 1e9)
        if deadline.tv_nsec >= 1_000_000_000 {
            deadline.tv_sec += 1
            deadline.tv_nsec -= 1_000_000_000
        }
        while !ready(value) {
            if pthread_cond_timedwait(condition, mutex, &deadline) == ETIMEDOUT { break }
        }
        return body(&value)
    }
}

extension Locked where Value == Bool {
    /// Sets the flag and wakes every waiter; whether this call set it (false when it was set
    /// already): what makes a `close()` run once.
    public func setOnce() -> Bool {
        withLockNotifyingAll { flag in
            defer { flag = true }
            return !flag
        }
    }
}
