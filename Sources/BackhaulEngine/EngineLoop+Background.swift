import BackhaulCore
import Curl

/// Background uploads (`network_service_type: background`, docs/policy.md): each path's LEDBAT
/// controller is fed `TCP_INFO` of one of its transfers' sockets about once an RTT (every 10 to
/// 50 ms; the loop wakes at least every 20 ms while one runs), and its rate is shared equally
/// among the path's background uploads, each socket paced by the kernel at its share
/// (`SO_MAX_PACING_RATE`). A path is a destination: scheme, host and port. Downloads are not
/// paced (docs/policy.md says why).
extension EngineLoop {
    /// `TCP_NOTSENT_LOWAT` of a background upload's socket.
    static let backgroundNotSentLowWatermark: Int32 = 128 << 10

    /// One path's controller and when it last stepped (monotonic seconds).
    struct Pacer {
        var controller = LedbatController()
        var lastStep = -Double.infinity
        var lastRTT = 0.05
        /// What each of the path's transfers gets (bytes/s).
        var share: Int64 = 0
    }

    /// Whether `transfer` is paced: an upload whose service type is `background`.
    func pacedInBackground(_ transfer: Transfer) -> Bool {
        transfer.part == nil && policy.networkServiceType(for: transfer.configuration) == .background
    }

    /// Feeds each background path's controller and applies its rate; called after each perform.
    /// Returns at once while no background upload runs.
    func paceBackground() {
        guard backgroundRunning else { return }
        let now = monotonicSeconds()
        var paths: [String: [Transfer]] = [:]
        for transfer in active.values {
            transfer.background = pacedInBackground(transfer)
            guard transfer.background else {
                if transfer.pacedRate != nil { transfer.pace(nil) }
                transfer.pacing = nil
                continue
            }
            paths[transfer.limitKey.host, default: []].append(transfer)
        }
        backgroundRunning = !paths.isEmpty
        pacers = pacers.filter { paths[$0.key] != nil }
        var totalRate: Int64 = 0
        var worstDelay = 0.0
        for (path, transfers) in paths {
            var pacer = pacers[path] ?? Pacer()
            if now - pacer.lastStep >= min(0.05, max(0.01, pacer.lastRTT)) {
                step(&pacer, transfers, now: now)
                let pacing = BackgroundPacing(rateBytesPerSecond: pacer.share, queueDelay: pacer.controller.queueDelay)
                for transfer in transfers {
                    transfer.pace(pacer.share)
                    transfer.pacing = pacing
                }
            }
            pacers[path] = pacer
            totalRate += pacer.share * Int64(transfers.count)
            worstDelay = max(worstDelay, pacer.controller.queueDelay)
        }
        metrics.backgroundRate = totalRate
        metrics.queueDelay = worstDelay
    }

    /// One controller step from one connection's `TCP_INFO`: the oldest transfer's, so that its
    /// retransmit count stays one connection's. Without a sample the share stays (at first the
    /// controller's start rate).
    private func step(_ pacer: inout Pacer, _ transfers: [Transfer], now: Double) {
        defer {
            let rate = pacer.controller.paused ? pacer.controller.parameters.probeRate : Int64(pacer.controller.rate)
            pacer.share = max(1024, rate / Int64(transfers.count))
        }
        guard let speaker = transfers.min(by: { $0.task.sequence < $1.task.sequence }), let info = speaker.easy.tcpInfo,
            info.rtt > 0
        else { return }
        let retransmits = max(0, info.totalRetransmits - (speaker.lastRetransmits ?? info.totalRetransmits))
        speaker.lastRetransmits = info.totalRetransmits
        let sample = PathSample(
            rtt: info.rtt, minRTT: info.minRTT, notSentBytes: info.notSentBytes, deliveryRate: info.deliveryRate,
            retransmits: retransmits)
        pacer.lastStep = now
        pacer.lastRTT = info.rtt
        _ = pacer.controller.step(sample, now: now)
    }
}
