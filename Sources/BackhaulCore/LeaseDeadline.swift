/// How long a fleet node may send on its leases while it cannot reach the database (docs/fleet.md,
/// "When a node cannot reach the database"). A lease the database renews at a beat runs out a lease
/// after that beat ran on the server, which is after it was sent: so a node that counts from when
/// its last answered beat was *sent* can never outlast a lease another node sees. The margin
/// covers the bytes already handed to curl and the kernel when the deadline passes.
public struct LeaseDeadline: Sendable, Equatable {
    /// The lease, in seconds.
    public let lease: Double
    /// When the newest beat that the database answered was sent (monotonic seconds).
    public private(set) var lastBeatSent: Double
    /// Whether the deadline passed before the newest beat was answered: the leases renewed by that
    /// beat may already be another node's.
    public private(set) var lapsedBeforeAnswer = false

    public init(lease: Double, beatSentAt: Double) {
        self.lease = lease
        lastBeatSent = beatSentAt
    }

    /// A tenth of the lease, at least 0.1 s and at most 2 s.
    public var margin: Double { min(2, max(0.1, lease / 10)) }

    /// The last moment (monotonic seconds) at which the node may still hand a byte to a transfer.
    public var sendUntil: Double { lastBeatSent + lease - margin }

    public func allowsSending(at now: Double) -> Bool { now < sendUntil }

    /// A beat sent at `sentAt` was answered at `answeredAt`: the deadline counts from `sentAt`
    /// (never backwards), and `lapsedBeforeAnswer` says whether it had passed meanwhile.
    public mutating func beatAnswered(sentAt: Double, answeredAt: Double) {
        lapsedBeforeAnswer = !allowsSending(at: answeredAt)
        lastBeatSent = max(lastBeatSent, sentAt)
    }
}
