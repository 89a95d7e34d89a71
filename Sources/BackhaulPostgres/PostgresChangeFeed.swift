import BackhaulCore
import BackhaulQueue
import Glibc
import JSONCodec
import PostgreSQL
import Threads

/// Hears the other nodes' changes (`LISTEN`) on a thread and a connection of its own, and hands
/// them to the observers. After its connection was lost, what it may have missed is made up for
/// by a change that reads everything again (the queue, the events, the outbox).
///
/// A connection that is open but whose session stopped answering (a stopped backend: its kernel
/// still acknowledges, so keepalives find nothing wrong) would hear nothing, silently. So when
/// nothing was heard for `probeAfter` seconds the connection is asked a `SELECT 1`, which it must
/// answer within a lease, as every call of the node's connections must; past it the connection is
/// given up and made anew, and everything is read again.
final class PostgresChangeFeed: @unchecked Sendable {
    private let url: String
    private let node: String
    private let runsShared: Bool
    /// Its connection's `application_name` (the fault tests find the listening sessions by it:
    /// their last statement is the probe's as often as `LISTEN`).
    static let connectionName = "backhauld listen"
    /// The lease: how long a call waits for the server.
    private let lease: Double
    /// Seconds without a notification after which the connection is probed.
    private var probeAfter: Double { min(2, lease / 2) }
    private let deliver: @Sendable (StoreChanges) -> Void
    private let stopping = Locked(false)
    /// Whether it has listened once.
    private let listening = Locked(false)
    private let thread = WorkerThread(name: "bh-pg-listen")

    init(
        url: String, node: String, runsShared: Bool, lease: Double, deliver: @escaping @Sendable (StoreChanges) -> Void
    ) {
        self.url = url
        self.node = node
        self.runsShared = runsShared
        self.lease = lease
        self.deliver = deliver
    }

    /// Starts listening; returns once it does, or after `wait` seconds (it goes on trying).
    func start(wait: Double = 5) {
        thread.start { [self] in loop() }
        listening.wait(until: { $0 }, timeout: wait) { _ in }
    }

    func stop() {
        stopping.withLockNotifyingAll { $0 = true }
        thread.join()
    }

    private func loop() {
        var connection: PostgresConnection?
        var failures = 0
        var heardAt = monotonicSeconds()
        while !stopping.withLock({ $0 }) {
            do {
                if connection == nil {
                    let fresh = try PostgresConnection(url, connectTimeout: 5, deadline: lease, name: Self.connectionName)
                    try fresh.listen(PostgresWriter.channel)
                    connection = fresh
                    // What changed before it listened (since the store opened, or while the
                    // connection was down) is read again.
                    var catchUp = StoreChanges()
                    catchUp.readEverything()
                    deliver(catchUp)
                    listening.withLockNotifyingAll { $0 = true }
                    failures = 0
                    heardAt = monotonicSeconds()
                }
                let notifications = try connection!.notifications(waitingUpTo: 0.25)
                for notification in notifications {
                    if let changes = ChangeMessage.decode(notification.payload, node: node, runsShared: runsShared) {
                        deliver(changes)
                    }
                }
                if !notifications.isEmpty {
                    heardAt = monotonicSeconds()
                } else if monotonicSeconds() - heardAt > probeAfter {
                    try connection!.execute("SELECT 1")
                    heardAt = monotonicSeconds()
                }
            } catch {
                connection = nil
                failures += 1
                let pause = min(5.0, 0.1 * Double(1 << min(failures, 6)))
                _ = stopping.wait(until: { $0 }, timeout: pause) { $0 }
            }
        }
    }
}

extension StoreChanges {
    /// What a node that may have missed changes reads again: everything (`queueReload`: the queue,
    /// sessions, settings), and the event stream, the outbox, the cleanups and the policy's review are
    /// woken.
    mutating func readEverything() {
        queueReload = true
        eventsAppended = true
        deliveriesAdded = true
        cleanupsAdded = true
        policyReview = true
    }
}
