import BackhaulCore
import BackhaulFiles
import Glibc

/// What the loop tells the service manager (systemd's notify socket): `WATCHDOG=1` from this
/// thread, so an engine that stops turning stops the keep-alives and is restarted, and a one-line
/// status when it changes.
extension EngineLoop {
    /// At most one status line a second.
    static let statusInterval = 1.0

    /// Sends what is due; called at each turn.
    func superviseIfDue(_ monotonic: Double) {
        guard let notifier = options.notifier, notifier.isEnabled else { return }
        if let interval = notifier.watchdogInterval, monotonic - lastWatchdog >= interval {
            lastWatchdog = monotonic
            notifier.watchdog()
        }
        if monotonic - lastStatus >= Self.statusInterval {
            lastStatus = monotonic
            let line = statusLine
            if line != lastStatusLine {
                lastStatusLine = line
                notifier.status(line)
            }
        }
    }

    /// "running 2, queued 14, network wifi (networkmanager)".
    var statusLine: String {
        var line = "running \(active.count), queued \(scheduler.queuedCount), network \(network.type.rawValue)"
        if network.expensive { line += " expensive" }
        if network.constrained { line += " constrained" }
        if network.roaming { line += " roaming" }
        if network.connectivity != .full && network.connectivity != .unknown { line += " \(network.connectivity.rawValue)" }
        return line + " (\(network.source.rawValue))"
    }

    /// Seconds until the next keep-alive is due (nil: no watchdog).
    var untilWatchdog: Double? {
        guard let interval = options.notifier?.watchdogInterval else { return nil }
        return max(0, lastWatchdog + interval - monotonicSeconds())
    }

    /// The test hook of `EngineOptions.testStallFile`: the file's number of seconds, slept here.
    func stallIfAsked() {
        guard let path = options.testStallFile, access(path, F_OK) == 0 else { return }
        let text = SmallFile.read(path).map { String(decoding: $0, as: UTF8.self) } ?? ""
        unlink(path)
        let seconds = min(600, max(0, Double(text.trimmed()) ?? 0))
        logger.warning("test hook: the engine loop stalls", metadata: ["stall.seconds": "\(seconds)"])
        usleep(UInt32(seconds * 1_000_000))
    }
}
