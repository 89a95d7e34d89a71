import CSystemd
import Glibc

/// systemd's notification protocol (sd_notify(3)): a datagram of `KEY=value` lines to the socket
/// named by `NOTIFY_SOCKET`. Without that variable nothing is sent. `sd_notify` opens, sends and
/// closes on each call, so any thread may use this.
public struct ServiceNotifier: Sendable {
    /// Whether a service manager listens (`NOTIFY_SOCKET` is set).
    public let isEnabled: Bool
    /// How often the watchdog must hear from the service: half of `WATCHDOG_USEC`, as sd_notify(3)
    /// advises; nil when no watchdog is set (or it is meant for another process: `WATCHDOG_PID`).
    public let watchdogInterval: Double?

    /// Reads the environment; it is left as it is (children do not inherit anything from it
    /// because the daemon starts none).
    public init() {
        isEnabled = getenv("NOTIFY_SOCKET") != nil
        var microseconds: UInt64 = 0
        if isEnabled, sd_watchdog_enabled(0, &microseconds) > 0, microseconds > 0 {
            watchdogInterval = Double(microseconds) / 2_000_000
        } else {
            watchdogInterval = nil
        }
    }

    /// Sends `assignments` (newline-separated `KEY=value`); false when nothing was sent.
    @discardableResult
    public func notify(_ assignments: String) -> Bool {
        guard isEnabled else { return false }
        return sd_notify(0, assignments) > 0
    }

    /// The service is up: `READY=1`. It carries no status line, so that the one systemd shows stays
    /// the last one `status(_:)` sent (the engine sends its first before the daemon is ready).
    public func ready() { notify("READY=1") }

    /// A one-line summary shown by `systemctl status`.
    public func status(_ line: String) { notify("STATUS=" + Self.oneLine(line)) }

    /// The watchdog's keep-alive.
    public func watchdog() { notify("WATCHDOG=1") }

    /// The service is stopping.
    public func stopping(status: String) { notify("STOPPING=1\nSTATUS=" + Self.oneLine(status)) }

    static func oneLine(_ text: String) -> String {
        String(text.map { $0 == "\n" || $0 == "\r" ? " " : $0 })
    }
}
