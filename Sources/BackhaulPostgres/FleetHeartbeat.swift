import PostgreSQL
import Threads

/// A node's heartbeat on a thread of its own (docs/fleet.md): every third of a lease it renews the
/// leases it holds and takes over what silent nodes left, on a connection of its own. It tells
/// its owner which tasks it no longer holds (their transfers must stop at once) and when the
/// database could not be reached (`/readyz` turns 503; the leases run out on their own).
public final class FleetHeartbeat: Sendable {
    /// What one beat found.
    public struct Beat: Sendable, Equatable {
        /// Tasks this node runs whose lease it no longer holds.
        public var lost: Set<String>
        /// Tasks of silent nodes queued again by this beat, and pinned ones set waiting.
        public var requeued: Int
        public var waiting: Int
    }

    private let url: String
    private let node: String
    private let leaseSeconds: Double
    private let thread = WorkerThread(name: "bh-heartbeat")
    private let state = Locked<(stopping: Bool, running: Set<String>)>((false, []))
    private let onBeat: @Sendable (Beat) -> Void
    private let onError: @Sendable (PostgresError) -> Void

    public init(
        url: String, node: String, leaseSeconds: Double, onBeat: @escaping @Sendable (Beat) -> Void,
        onError: @escaping @Sendable (PostgresError) -> Void
    ) {
        self.url = url
        self.node = node
        self.leaseSeconds = leaseSeconds
        self.onBeat = onBeat
        self.onError = onError
    }

    /// The tasks this node runs now: the ones each beat checks its leases against.
    public func running(_ ids: Set<String>) { state.withLock { $0.running = ids } }

    public func start() {
        thread.start { [self] in loop() }
    }

    /// Stops beating (the leases then run out unless the node ends its tasks first) and waits
    /// for the thread.
    public func stop() {
        state.withLockNotifyingAll { $0.stopping = true }
        thread.join()
    }

    private func loop() {
        var queue: LeaseQueue?
        let interval = max(0.05, leaseSeconds / 3)
        while !state.withLock({ $0.stopping }) {
            do {
                if queue == nil {
                    queue = LeaseQueue(db: try PostgresConnection(url, connectTimeout: 5), node: node, leaseSeconds: leaseSeconds)
                }
                if let queue {
                    let running = state.withLock { $0.running }
                    let held = try queue.heartbeat(running: running.count)
                    let (requeued, waiting) = try queue.takeOver()
                    onBeat(Beat(lost: running.subtracting(held), requeued: requeued, waiting: waiting))
                }
            } catch {
                let failure = error as? PostgresError ?? PostgresError(kind: .statement, message: "\(error)")
                // A broken connection is made anew at the next beat.
                if failure.isConnectionLost { queue = nil }
                onError(failure)
            }
            sleepUnlessStopping(interval)
        }
    }

    /// Waits a beat's interval, or less when `stop()` comes meanwhile.
    private func sleepUnlessStopping(_ seconds: Double) {
        state.wait(until: { $0.stopping }, timeout: seconds) { _ in }
    }
}
