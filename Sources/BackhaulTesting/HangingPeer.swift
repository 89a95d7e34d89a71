import Foundation
import Glibc

/// A TCP peer on loopback that takes connections and never answers: a credential endpoint, a
/// signer or a webhook receiver that hangs. The kernel completes each handshake into the
/// listening socket's backlog and nothing reads what is sent, until `deinit` closes it.
public final class HangingPeer {
    public let port: UInt16
    private let descriptor: Int32

    public init() throws {
        descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw DaemonProcess.DaemonError(message: "socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let fd = descriptor
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(fd, pointer, length) == 0 && listen(fd, 4096) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        guard bound else {
            close(descriptor)
            throw DaemonProcess.DaemonError(message: "cannot listen: errno \(errno)")
        }
        port = UInt16(bigEndian: address.sin_port)
    }

    deinit { close(descriptor) }

    public func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }
}
