import BackhaulCore
import Testing

@Suite("LEDBAT controller")
struct LedbatTests {
    /// Feeds `rtts` (milliseconds) 50 ms apart from `start`; returns every action.
    static func feed(
        _ controller: inout LedbatController, _ rtts: [Double], from start: Double = 0, retransmits: [Int64]? = nil,
        deliveryRate: Int64 = 0
    ) -> [LedbatController.Action] {
        rtts.enumerated().map { index, rtt in
            let sample = PathSample(
                rtt: rtt / 1000, notSentBytes: 0, deliveryRate: deliveryRate, retransmits: retransmits?[index] ?? 0)
            return controller.step(sample, now: start + Double(index) * 0.05)
        }
    }

    static func rate(_ action: LedbatController.Action) -> Int64 {
        if case .pace(let rate) = action { return rate }
        return -1
    }

    @Test("start: the first sample sets the base, paces at the start rate, and an idle path lets it grow")
    func start() {
        var parameters = LedbatController.Parameters()
        parameters.maximumAckDelay = 0
        var controller = LedbatController(parameters: parameters)
        let actions = Self.feed(&controller, Array(repeating: 1, count: 21))
        #expect(Self.rate(actions[0]) == LedbatController.Parameters().startRate)
        #expect(controller.baseDelay == 0.001)
        #expect(controller.queueDelay == 0)
        let rates = actions.map(Self.rate)
        #expect(zip(rates, rates.dropFirst()).allSatisfy { $0 < $1 })
        // A second at no queueing delay multiplies the rate by about e^2.
        #expect(rates[20] > 5 * rates[0])
    }

    /// Rows: queueing delay held (ms) → the rate after a second, against where it started
    /// (grows, holds within a tenth, shrinks), and whether it pauses.
    @Test(
        "a rising delay: below the target it grows, at the target it holds, past it it shrinks, far past it pauses",
        arguments: [
            (0.0, 1, false), (6.25, 1, false), (12.5, 0, false), (20, -1, false), (60, -1, false), (150, -1, true),
        ])
    func risingDelay(delay: Double, direction: Int, pauses: Bool) {
        var parameters = LedbatController.Parameters()
        parameters.maximumAckDelay = 0
        var controller = LedbatController(parameters: parameters)
        let floor = Double(LedbatController.Parameters().minimumRate)
        // The base, then four samples at the delay: the current-delay filter (the least of the
        // last four) no longer sees the base.
        _ = Self.feed(&controller, [1] + Array(repeating: 1 + delay, count: 4))
        let before = controller.rate
        let actions = Self.feed(&controller, Array(repeating: 1 + delay, count: 20), from: 0.25)
        let ratio = controller.rate / before
        switch direction {
        case 1: #expect(ratio > 1.1)
        case 0: #expect(abs(ratio - 1) < 0.1)
        default: #expect(ratio < 0.9 || controller.rate == floor || pauses)
        }
        #expect((actions.last == .pause) == pauses)
        #expect(abs(controller.queueDelay - delay / 1000) < 1e-9)
        #expect(controller.rate >= Double(LedbatController.Parameters().minimumRate))
    }

    @Test("loss: a rise in retransmits halves the rate at once, at most once per RTT")
    func loss() {
        var controller = LedbatController()
        _ = Self.feed(&controller, Array(repeating: 1, count: 20))
        let before = controller.rate
        // Retransmits on two samples 50 ms apart with a 100 ms RTT: one halving.
        var actions: [LedbatController.Action] = []
        for (index, retransmits) in [Int64(3), 2].enumerated() {
            actions.append(controller.step(PathSample(rtt: 0.1, retransmits: retransmits), now: 1 + Double(index) * 0.05))
        }
        #expect(controller.rate < before * 0.51)
        #expect(controller.rate > before * 0.2)
        #expect(actions.allSatisfy { $0 != .pause })
    }

    @Test("recovery: paused while another flow holds the queue, and back at 4 MB/s within 5 s of its end")
    func recovery() {
        var controller = LedbatController()
        _ = Self.feed(&controller, Array(repeating: 1, count: 10))
        // Another flow's queue climbs past the target (cut), then holds 300 ms for a second
        // (paused, the rate held).
        _ = Self.feed(&controller, [21, 31, 41, 301, 301], from: 0.5)
        #expect(controller.paused)
        let cut = controller.rate
        let during = Self.feed(&controller, Array(repeating: 301, count: 18), from: 0.75)
        #expect(during.allSatisfy { $0 == .pause })
        #expect(controller.rate == cut)
        // It stops: the queue drains and the delay is back at the base; the rate resumes at half
        // what it was before the queue, not at the cut.
        let actions = Self.feed(&controller, Array(repeating: 1, count: 100), from: 1.65)
        #expect(!controller.paused)
        #expect(Self.rate(actions[0]) > Int64(cut))
        let reached = actions.firstIndex { Self.rate($0) >= 4_000_000 }
        #expect(reached != nil && reached! * 50 <= 5_000)
    }

    @Test("a queue draining past the target (the RTT falling after a pause) holds the rate; one that stays is cut")
    func draining() {
        var controller = LedbatController()
        _ = Self.feed(&controller, Array(repeating: 1, count: 10))
        _ = Self.feed(&controller, Array(repeating: 201, count: 4), from: 0.5)
        #expect(controller.paused)
        let held = controller.rate
        _ = Self.feed(&controller, [81, 61, 41, 31], from: 0.7)
        #expect(!controller.paused)
        #expect(controller.rate >= held)
        let resumed = controller.rate
        _ = Self.feed(&controller, [31, 31, 31], from: 0.9)
        #expect(controller.rate < resumed)
    }

    @Test("a sparse flow's delayed ACKs are not queue: at 32 KiB/s a 40 ms RTT over a 1 ms base reads as none")
    func delayedAcks() {
        var parameters = LedbatController.Parameters()
        parameters.startRate = 32 << 10
        parameters.minimumRate = 16 << 10
        parameters.probeRate = 16 << 10
        var controller = LedbatController(parameters: parameters)
        _ = Self.feed(&controller, [1, 41, 41])
        #expect(controller.queueDelay == 0)
        #expect(controller.rate > Double(parameters.startRate))
        // At 4 MB/s a segment's interval is 0.36 ms: the same 40 ms is queue.
        parameters.startRate = 4_000_000
        var fast = LedbatController(parameters: parameters)
        _ = Self.feed(&fast, [1, 41, 41])
        #expect(fast.queueDelay > 0.039)
    }

    @Test("the rate grows to at most twice what the path delivered, and not while the sender has too little to send")
    func growthBounds() {
        var controller = LedbatController()
        _ = Self.feed(&controller, Array(repeating: 1, count: 40), deliveryRate: 300_000)
        #expect(controller.rate <= 600_000)
        // Nothing unsent and 100 kB/s delivered of 512 KiB/s: the sender has too little to send.
        var idle = LedbatController()
        for index in 0..<20 {
            _ = idle.step(PathSample(rtt: 0.001, notSentBytes: 0, deliveryRate: 100_000), now: Double(index) * 0.05)
        }
        #expect(idle.rate == Double(LedbatController.Parameters().startRate))
    }

    @Test("a base that moves: down is followed at once, up once the old buckets have rolled out")
    func movingBase() {
        var parameters = LedbatController.Parameters()
        parameters.bucketSeconds = 1
        parameters.baseBuckets = 3
        var controller = LedbatController(parameters: parameters)
        _ = controller.step(PathSample(rtt: 0.020, minRTT: 0.020), now: 0)
        #expect(controller.baseDelay == 0.020)
        // Down: a new route with 5 ms; the kernel's new minimum counts at once.
        _ = controller.step(PathSample(rtt: 0.006, minRTT: 0.005), now: 0.5)
        #expect(controller.baseDelay == 0.005)
        // Up: 40 ms from now on. The kernel's minimum stays 5 ms but is not new, so it does not pin
        // the base; the 5 ms bucket rolls out after three buckets.
        var now = 0.6
        var samples: [(Double, Double?)] = []
        while now < 5 {
            _ = controller.step(PathSample(rtt: 0.040, minRTT: 0.005), now: now)
            samples.append((now, controller.baseDelay))
            now += 0.1
        }
        #expect(samples.first { $0.0 < 2 }?.1 == 0.005)
        #expect(samples.last?.1 == 0.040)
        #expect(controller.queueDelay == 0)
    }

    @Test("the service types, as the API spells them")
    func serviceTypes() {
        #expect(NetworkServiceType.allCases.map(\.rawValue) == ["default", "background"])
    }
}
