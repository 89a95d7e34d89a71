import BackhaulCore
import Testing

@Suite("LeaseDeadline")
struct LeaseDeadlineTests {
    @Test(
        "the margin is a tenth of the lease, at least 0.1 s and at most 2 s",
        arguments: [(0.5, 0.1), (2, 0.2), (30, 2), (60, 2)] as [(Double, Double)])
    func margin(_ lease: Double, _ margin: Double) {
        #expect(LeaseDeadline(lease: lease, beatSentAt: 0).margin == margin)
    }

    /// (lease, beats as (sent, answered), now, may send, lapsed before the last answer)
    static let rows: [(Double, [(Double, Double)], Double, Bool, Bool)] = [
        // No beat answered yet: counted from the start.
        (2, [], 1.79, true, false),
        (2, [], 1.8, false, false),
        // Counted from when the beat was sent, not from its answer.
        (2, [(1.0, 1.5)], 2.79, true, false),
        (2, [(1.0, 1.5)], 2.8, false, false),
        // A slow answer moves the deadline no further than its send time.
        (2, [(1.0, 1.7)], 2.81, false, false),
        // An answer after the deadline passed: the leases it held may be another node's.
        (2, [(1.0, 1.1), (2.0, 3.5)], 3.6, true, true),
        // An older beat answered late never moves the deadline back.
        (2, [(3.0, 3.1), (2.0, 3.2)], 4.79, true, false),
        (30, [(10, 40)], 37.9, true, true),
    ]

    @Test("the deadline runs a lease less the margin from the newest answered beat's send", arguments: rows.indices)
    func deadline(_ index: Int) {
        let (lease, beats, now, maySend, lapsed) = Self.rows[index]
        var deadline = LeaseDeadline(lease: lease, beatSentAt: 0)
        for (sent, answered) in beats { deadline.beatAnswered(sentAt: sent, answeredAt: answered) }
        #expect(deadline.allowsSending(at: now) == maySend)
        #expect(deadline.lapsedBeforeAnswer == lapsed)
    }
}
