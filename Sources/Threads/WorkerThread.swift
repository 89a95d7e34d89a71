import Glibc

/// A joinable POSIX thread running one closure (the engine's and the dispatcher's loops).
public final class WorkerThread: @unchecked Sendable {
    public init() {}
    // @unchecked: `thread` is written once by start() before any join() and read only by join().
    private var thread = pthread_t()
    private var started = false

    private final class Box {
        let body: () -> Void
        init(_ body: @escaping () -> Void) { self.body = body }
    }

    public func start(_ body: @escaping @Sendable () -> Void) {
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        let result = pthread_create(
            &thread, nil,
            { argument in
                let box = Unmanaged<Box>.fromOpaque(argument!).takeRetainedValue()
                box.body()
                return nil
            }, box)
        precondition(result == 0, "cannot start a thread: \(result)")
        started = true
    }

    public func join() {
        guard started else { return }
        started = false
        pthread_join(thread, nil)
    }
}
