/// How a transfer shares the link (`network_service_type`, as URLSession names it): `default` sends
/// as fast as TCP lets it; `background` paces by the path's queueing delay and yields to every other
/// flow (docs/policy.md). Independent of `discretionary`, which decides *when* a task runs.
public enum NetworkServiceType: String, Sendable, CaseIterable {
    case `default`
    case background
}

/// What one TCP connection shows of its path at one moment (Linux `TCP_INFO`), in the units the
/// controller reasons in.
public struct PathSample: Sendable, Equatable {
    /// The smoothed round-trip time (`tcpi_rtt`; a download's `tcpi_rcv_rtt`), seconds.
    public var rtt: Double
    /// The least round-trip time the connection has seen (`tcpi_min_rtt`), seconds; 0 when unknown.
    public var minRTT: Double
    /// Bytes written to the socket that TCP has not sent yet (`tcpi_notsent_bytes`).
    public var notSentBytes: Int64
    /// The kernel's estimate of what the path delivered lately (`tcpi_delivery_rate`), bytes/s.
    public var deliveryRate: Int64
    /// Segments retransmitted since the previous sample of the same connection (from
    /// `tcpi_total_retrans`): any is a loss.
    public var retransmits: Int64

    public init(rtt: Double, minRTT: Double = 0, notSentBytes: Int64 = 0, deliveryRate: Int64 = 0, retransmits: Int64 = 0) {
        self.rtt = rtt
        self.minRTT = minRTT
        self.notSentBytes = notSentBytes
        self.deliveryRate = deliveryRate
        self.retransmits = retransmits
    }
}

/// A LEDBAT controller (RFC 6817) driving a send *rate* rather than a window: curl paces by rate
/// (`CURLOPT_MAX_SEND_SPEED_LARGE`), and the kernel keeps its own window.
///
/// - The queueing delay is the current delay (the least RTT of the last two samples, RFC 6817
///   `CURRENT_FILTER`; the kernel's RTT is already smoothed) minus the base delay (the least RTT over `baseBuckets` buckets of
///   `bucketSeconds` each, RFC 6817's base history: a base that moves up is followed once the old
///   buckets have rolled out; one that moves down at once).
/// - Below the target the rate grows in proportion to how far below it is (`off_target`), by
///   `increasePerSecond` e-folds a second at most; above it, it shrinks in proportion, by at most
///   30 % a sample, unless the queue is already draining; a loss (retransmits going up) halves it at once, at most once per RTT.
/// - When the delay is far past the target (`pauseDelay`) the controller asks for a pause: what
///   else shares the link has filled the queue. The rate is held meanwhile, and resumes at no less
///   than half what it was before that queue built.
/// - The rate never grows past twice what the path delivered, nor while the sender has too little
///   to send (nothing unsent in the socket, less than half the rate delivered): an idle sender's
///   rate means nothing.
///
/// Pure: the samples and `now` (monotonic seconds) come in, the rate goes out. Several background
/// transfers on one path share one controller: each sample comes from any of them, and the rate is
/// the path's, shared among them by the caller.
public struct LedbatController: Sendable, Equatable {
    public struct Parameters: Sendable, Equatable {
        /// The queueing delay aimed at: half of the lab's p50 allowance (idle + 25 ms), so that the
        /// oscillation around it stays within the allowance.
        public var target = 0.0125
        public var increasePerSecond = 2.0
        public var decreasePerSecond = 3.0
        /// Past this much queueing delay, the controller pauses the path's background transfers.
        public var pauseDelay = 0.1
        /// The least rate asked for while not paused. Not lower: the kernel paces a GSO burst
        /// (up to 64 KiB) at the rate in force when it went, and a raised rate waits for the
        /// next one (measured: at 32 KiB/s, nothing sent for 2 s after the rate went up).
        public var minimumRate: Int64 = 256 << 10
        public var startRate: Int64 = 512 << 10
        /// What a pause still sends (5 % of a 40 Mbit link): the RTT keeps being measured, the
        /// controller sees the queue drain, and the socket's next burst is at most 0.25 s away.
        public var probeRate: Int64 = 256 << 10
        public var currentFilter = 2
        /// A receiver acknowledges every second segment, or after its delayed-ACK timer (40 ms on
        /// Linux): a sparse flow's RTT carries up to one segment's interval of it, which is not
        /// queue. The queueing delay is measured less min(`maximumAckDelay`, `segmentSize` / rate).
        public var segmentSize = 1448.0
        public var maximumAckDelay = 0.04
        public var bucketSeconds = 60.0
        public var baseBuckets = 10

        public init() {}
    }

    public enum Action: Sendable, Equatable {
        /// Send at most this many bytes a second.
        case pace(Int64)
        /// Send nothing for now: the queue is far past the target.
        case pause
    }

    public let parameters: Parameters
    /// The rate in force (bytes/s), also while paused (where it resumes).
    public private(set) var rate: Double
    /// The last measured queueing delay (seconds).
    public private(set) var queueDelay: Double = 0
    public private(set) var paused = false
    /// The least RTT of each bucket, oldest first; the last is the current bucket.
    private var baseHistory: [Double] = []
    private var bucketStarted: Double?
    private var recentRTTs: [Double] = []
    private var lastStep: Double?
    private var lastMinRTT: Double = 0
    private var lastDecrease = -Double.infinity
    /// The rate when the queue last went past the target, while it stays past it (bytes/s).
    private var rateBeforeQueue: Double?
    /// The last current delay (seconds), to see the queue drain.
    private var lastCurrent = 0.0

    public init(parameters: Parameters = Parameters()) {
        self.parameters = parameters
        rate = Double(parameters.startRate)
    }

    /// The base delay: the least RTT over the base history (nil before the first sample).
    public var baseDelay: Double? { baseHistory.min() }

    /// Takes one sample of the path at `now` and says what to send at.
    public mutating func step(_ sample: PathSample, now: Double) -> Action {
        let elapsed = min(1, max(0, now - (lastStep ?? now)))
        lastStep = now
        recordBase(sample, now: now)
        recentRTTs.append(sample.rtt)
        if recentRTTs.count > parameters.currentFilter { recentRTTs.removeFirst() }
        let current = recentRTTs.min() ?? sample.rtt
        // The rate the samples were sent at: the probe's while paused.
        let sending = paused ? Double(parameters.probeRate) : rate
        let ackDelay = min(parameters.maximumAckDelay, parameters.segmentSize / max(sending, 1))
        let draining = current < lastCurrent
        lastCurrent = current
        queueDelay = max(0, current - (baseDelay ?? current) - ackDelay)
        let lost = sample.retransmits > 0
        // Far past the target another flow holds the queue: pause, and hold the rate where it
        // resumes once the queue drains (cutting it meanwhile only slows the return).
        let wasPaused = paused
        paused = queueDelay > parameters.pauseDelay
        if paused { return .pause }
        if wasPaused, let before = rateBeforeQueue {
            // Back from a pause: at half the rate before the other flow's queue built, rather
            // than at what the climb past the target had cut it to.
            rate = max(rate, before / 2)
        }
        if queueDelay <= parameters.target { rateBeforeQueue = nil }

        let floor = Double(parameters.minimumRate)
        if lost, now - lastDecrease >= max(sample.rtt, 0.01) {
            lastDecrease = now
            rate = max(floor, rate / 2)
        } else if queueDelay > parameters.target {
            // A queue that is draining needs no cut (the path already carries less than it
            // can): after a pause the RTT falls for a while, and cutting then only slows the return.
            guard !draining else { return .pace(Int64(rate.rounded())) }
            if rateBeforeQueue == nil { rateBeforeQueue = rate }
            let offTarget = (parameters.target - queueDelay) / parameters.target
            rate = max(floor, rate * max(0.7, 1 + offTarget * parameters.decreasePerSecond * elapsed))
        } else if !lost {
            let offTarget = (parameters.target - queueDelay) / parameters.target
            // Nothing waiting in the socket and the path delivering less than half the rate: the
            // sender has too little to send; a higher rate would mean nothing.
            let appLimited = sample.notSentBytes == 0 && sample.deliveryRate > 0 && Double(sample.deliveryRate) < rate / 2
            if !appLimited {
                var grown = rate * (1 + offTarget * parameters.increasePerSecond * elapsed)
                if sample.deliveryRate > 0 { grown = min(grown, max(rate, 2 * Double(sample.deliveryRate))) }
                rate = max(floor, grown)
            }
        }
        return .pace(Int64(rate.rounded()))
    }

    /// RFC 6817's base history: one minimum per bucket, the oldest dropped as a new bucket opens.
    /// The kernel's own minimum (`tcpi_min_rtt`) counts only when it is new, so that an old
    /// minimum does not pin a base that has moved up.
    private mutating func recordBase(_ sample: PathSample, now: Double) {
        var candidate = sample.rtt
        if sample.minRTT > 0, sample.minRTT != lastMinRTT {
            candidate = min(candidate, sample.minRTT)
            lastMinRTT = sample.minRTT
        }
        if let started = bucketStarted, now - started < parameters.bucketSeconds, !baseHistory.isEmpty {
            baseHistory[baseHistory.count - 1] = min(baseHistory[baseHistory.count - 1], candidate)
            return
        }
        bucketStarted = now
        baseHistory.append(candidate)
        if baseHistory.count > parameters.baseBuckets { baseHistory.removeFirst() }
    }
}
