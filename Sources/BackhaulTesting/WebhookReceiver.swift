import Foundation
import Glibc
import JSON

/// The Python receiver (`Tests/peers/webhook_receiver.py`) that verifies signatures with the
/// PyPI `standardwebhooks` library and logs each delivery. It can be stopped and started again
/// on the same port (a consumer outage).
public final class WebhookReceiver {
    public let port: UInt16
    public let logFile: String
    private let secrets: [String]
    private let extraArguments: [String]
    private var process: Process?

    static var script: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Tests/peers/webhook_receiver.py").path
    }

    public init(directory: String, secrets: [String], failFirst: Int = 0, status: Int = 204, start: Bool = true) throws {
        self.port = try freePort()
        self.logFile = directory + "/webhooks-\(port).jsonl"
        self.secrets = secrets
        self.extraArguments = ["--fail-first", String(failFirst), "--status", String(status)]
        FileManager.default.createFile(atPath: logFile, contents: nil)
        if start { try self.start() }
    }

    deinit { stop() }

    public var url: String { "http://127.0.0.1:\(port)/hooks" }

    public func start() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", Self.script, "--port", String(port), "--log", logFile] + secrets.flatMap { ["--secret", $0] }
            + extraArguments
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        self.process = process
        let port = self.port
        guard eventually(timeout: 15, { (try? connectable(port: port)) == true || !process.isRunning }), process.isRunning else {
            throw NginxServer.NginxError(message: "the webhook receiver did not start")
        }
    }

    /// SIGKILL: children of the test process inherit a mask with SIGTERM blocked, so a plain
    /// terminate() would never end the Python process.
    public func stop() {
        guard let process, process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        self.process = nil
    }

    /// Every delivery received so far, in order.
    public var deliveries: [JSON] {
        let text = (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }
    }

    /// Deliveries that verified and were answered 2xx.
    public var accepted: [JSON] {
        deliveries.filter { ($0["status"]?.intValue ?? 0) / 100 == 2 && !($0["verified_with"]?.arrayValue?.isEmpty ?? true) }
    }
}
