import Foundation
import Threads

/// A service manager's notify socket for tests: a unix datagram socket bound at `path` (give it to
/// the daemon as `NOTIFY_SOCKET`) that records every message it receives, with when it came.
public final class NotifySocket: @unchecked Sendable {
    public struct Message: Sendable {
        /// Monotonic seconds when it was read.
        public var at: Double
        /// Its `KEY=value` lines.
        public var lines: [String]
    }

    public let path: String
    private let descriptor: Int32
    private let received = Locked<[Message]>([])
    private let reader = WorkerThread(name: "notify-socket")
    private let closing = Locked(false)

    public init(path: String) throws {
        self.path = path
        unlink(path)
        descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw DaemonProcess.DaemonError(message: "socket: errno \(errno)") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            close(descriptor)
            throw DaemonProcess.DaemonError(message: "socket path too long: \(path)")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (index, byte) in bytes.enumerated() { raw[index] = byte }
        }
        let fd = descriptor
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0 else {
            close(descriptor)
            throw DaemonProcess.DaemonError(message: "bind \(path): errno \(errno)")
        }
        let descriptor = self.descriptor
        let received = self.received
        let closing = self.closing
        reader.start {
            var buffer = [UInt8](repeating: 0, count: 4096)
            while !closing.withLock({ $0 }) {
                var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
                guard poll(&poller, 1, 100) > 0 else { continue }
                let count = recv(descriptor, &buffer, buffer.count, 0)
                guard count > 0 else { continue }
                let text = String(decoding: buffer[0..<count], as: UTF8.self)
                let message = Message(
                    at: ProcessInfo.processInfo.systemUptime, lines: text.split(separator: "\n").map(String.init))
                received.withLock { $0.append(message) }
            }
        }
    }

    deinit {
        closing.withLock { $0 = true }
        reader.join()
        close(descriptor)
        unlink(path)
    }

    /// Every message so far.
    public var messages: [Message] { received.withLock { $0 } }

    /// The lines received so far, in order.
    public var lines: [String] { messages.flatMap(\.lines) }

    /// When each message holding `line` came (monotonic seconds).
    public func times(of line: String) -> [Double] { messages.filter { $0.lines.contains(line) }.map(\.at) }
}
