import Foundation
import Glibc

/// Runs `body(0..<count)` on `count` threads of their own, released together from a barrier so
/// the calls really overlap (a thread pool would run a few at a time); returns when all are done.
public func concurrently(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let barrier = UnsafeMutablePointer<pthread_barrier_t>.allocate(capacity: 1)
    pthread_barrier_init(barrier, nil, UInt32(count))
    let done = DispatchGroup()
    for index in 0..<count {
        done.enter()
        let pointer = UnsafeSendable(barrier)
        let thread = Thread {
            pthread_barrier_wait(pointer.value)
            body(index)
            done.leave()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
    done.wait()
    pthread_barrier_destroy(barrier)
    barrier.deallocate()
}

private struct UnsafeSendable<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
