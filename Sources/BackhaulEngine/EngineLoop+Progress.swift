import BackhaulCore
import BackhaulQueue

/// Live progress for the API (rates, bytes), `task.progress` events at a bounded rate, a
/// download's durable checkpoints, and the engine's figures for `/metrics`.
extension EngineLoop {
    func publishProgress(force: Bool) {
        let now = monotonicSeconds()
        guard force || now - lastPublish >= 0.25 else { return }
        lastPublish = now
        var live: [String: LiveProgress] = [:]
        for (id, transfer) in active {
            let bytes = transfer.bytesTransferred
            let elapsed = now - transfer.lastSample.time
            if elapsed >= 0.5 {
                let instant = Double(bytes - transfer.lastSample.bytes) / elapsed
                transfer.rate = transfer.rate == 0 ? instant : transfer.rate * 0.5 + instant * 0.5
                transfer.lastSample = (now, bytes)
            }
            countSent(transfer, bytes: bytes)
            // A download's checkpoint follows what is durable: fsync at most once a second (or
            // every 128 MiB), then save the offset.
            if transfer.part != nil, !transfer.verifying,
                now - transfer.lastPartSync >= 1 || bytes - transfer.lastPartSyncOffset >= 128 << 20, transfer.syncPart()
            {
                persistCheckpoint(transfer)
            }
            let progress = LiveProgress(
                bytesTransferred: bytes, bytesPerSecond: transfer.rate, background: transfer.background ? transfer.pacing : nil)
            live[id] = progress
            if now - transfer.lastProgressEvent >= options.progressInterval, bytes != transfer.lastProgressBytes {
                transfer.lastProgressEvent = now
                transfer.lastProgressBytes = bytes
                store.recordProgress(
                    sequence: transfer.task.sequence, attempt: transfer.attempt,
                    bytesTransferred: transfer.machine.bytesAcknowledged, live: progress)
            }
        }
        metrics.running = active.count
        metrics.queued = scheduler.queuedCount
        metrics.bandwidthLimit = policy.bandwidth(
            minuteOfDay: LocalTime.components(of: clock.now()).minute, network: network.type)
        metrics.budgetRemaining = [:]
        for (type, budget) in policy.discretionaryDailyBudget {
            metrics.budgetRemaining[type] = max(0, budget - budgetUsed[type, default: 0])
        }
        let figures = metrics
        engine.shared.withLock {
            $0.live = live
            $0.metrics = figures
        }
        flushBudget(force: force)
    }
}
