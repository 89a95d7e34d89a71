import CGlibc
import Glibc

/// A joinable POSIX thread running one closure (the curl loop's loop, the store's writer...).
/// It carries a name (`pthread_setname_np`, at most 15 bytes), so that `top -H`, `ps -L`,
/// `/proc/PID/task/*/comm` and a profiler tell the daemon's threads apart.
public final class WorkerThread: @unchecked Sendable {
    private let name: String

    public init(name: String) {
        precondition(name.utf8.count <= 15, "a thread's name is at most 15 bytes: \(name)")
        self.name = name
    }

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
        pthread_setname_np(thread, name)
        started = true
    }

    /// Lets the thread end on its own, its resources freed when it does: for a thread nobody
    /// waits for (`pthread_detach`). Call once, after `start`, instead of `join`.
    public func detach() {
        guard started else { return }
        started = false
        pthread_detach(thread)
    }

    public func join() {
        guard started else { return }
        started = false
        pthread_join(thread, nil)
    }
}
