import Foundation
import Glibc
import JSONCodec

/// The Python receiver (`Tests/peers/webhook_receiver.py`) that verifies signatures with the
/// PyPI `standardwebhooks` library and logs each delivery. It can be stopped and started again
/// on the same port (a consumer outage).
public final class WebhookReceiver {
    public let logFile: String
    private let peer: PythonPeer

    public init(
        directory: String, secrets: [String], failFirst: Int = 0, status: Int = 204, port: UInt16? = nil,
        start: Bool = true
    ) throws {
        logFile = directory + "/webhooks-\(UUID().uuidString).jsonl"
        _ = FileManager.default.createFile(atPath: logFile, contents: nil)
        peer = try PythonPeer(
            script: "webhook_receiver.py",
            arguments: ["--log", logFile, "--fail-first", String(failFirst), "--status", String(status)]
                + secrets.flatMap { ["--secret", $0] },
            port: port, start: start)
    }

    public var port: UInt16 { peer.port }
    public var url: String { "http://127.0.0.1:\(port)/hooks" }

    public func start() throws { try peer.start() }
    public func stop() { peer.stop() }

    /// Every delivery received so far, in order.
    public var deliveries: [JSON] { PythonPeer.lines(logFile) }

    /// Deliveries that verified and were answered 2xx.
    public var accepted: [JSON] {
        deliveries.filter { ($0["status"]?.intValue ?? 0) / 100 == 2 && !($0["verified_with"]?.arrayValue?.isEmpty ?? true) }
    }
}
