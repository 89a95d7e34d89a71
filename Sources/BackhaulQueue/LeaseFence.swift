import BackhaulCore
import Threads

/// The fleet's fence on the bytes a node sends (docs/fleet.md, "When a node cannot reach the
/// database"): the heartbeat moves its `LeaseDeadline` and revokes the tasks it lost; the engine
/// asks it where bytes are handed to curl, so a node whose heartbeat hangs on a dead link stops on
/// its own clock. It is in force once the heartbeat starts (`arm`), counting from the store's
/// opening, which came before any claim. A store of one daemon (SQLite) has none.
public final class LeaseFence: Sendable {
    private let state: Locked<(deadline: LeaseDeadline, revoked: Set<String>, armed: Bool)>

    public init(lease: Double, startedAt: Double = monotonicSeconds()) {
        state = Locked((LeaseDeadline(lease: lease, beatSentAt: startedAt), [], false))
    }

    /// Puts the fence in force: the heartbeat is about to beat.
    public func arm() { state.withLock { $0.armed = true } }

    public var deadline: LeaseDeadline { state.withLock { $0.deadline } }

    /// Whether the node may still send `taskID`'s bytes: its lease was not found lost, and the
    /// deadline has not passed.
    public func allowsSending(_ taskID: String, at now: Double = monotonicSeconds()) -> Bool {
        state.withLock { !$0.revoked.contains(taskID) && (!$0.armed || $0.deadline.allowsSending(at: now)) }
    }

    /// Whether the node may start transfers now.
    public func allowsStarting(at now: Double = monotonicSeconds()) -> Bool {
        state.withLock { !$0.armed || $0.deadline.allowsSending(at: now) }
    }

    /// A beat was answered; returns the deadline as it now stands.
    @discardableResult
    public func beatAnswered(sentAt: Double, answeredAt: Double = monotonicSeconds()) -> LeaseDeadline {
        state.withLock {
            $0.deadline.beatAnswered(sentAt: sentAt, answeredAt: answeredAt)
            return $0.deadline
        }
    }

    /// The tasks' leases were lost: their bytes stop at once.
    public func revoke(_ ids: some Sequence<String>) { state.withLock { $0.revoked.formUnion(ids) } }

    /// The tasks' leases were taken again (a new claim).
    public func restore(_ ids: some Sequence<String>) { state.withLock { $0.revoked.subtract(ids) } }
}
