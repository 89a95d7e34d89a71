import Foundation
import Glibc
import JSON

/// A Python test peer from `Tests/peers/`, on a port of its own, that can be stopped and started
/// again on the same port (an outage).
public final class PythonPeer {
    public let port: UInt16
    private let script: String
    private let arguments: [String]
    private var process: Process?

    public static func script(_ name: String) -> String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Tests/peers/\(name)").path
    }

    public init(script name: String, arguments: [String], start: Bool = true) throws {
        port = try freePort()
        script = Self.script(name)
        self.arguments = arguments
        if start { try self.start() }
    }

    deinit { stop() }

    public func start() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", script, "--port", String(port)] + arguments
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        self.process = process
        let port = self.port
        guard eventually(timeout: 20, { (try? connectable(port: port)) == true || !process.isRunning }), process.isRunning else {
            throw NginxServer.NginxError(message: "\(script) did not start")
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

    /// The JSON lines of a log file the peer writes.
    public static func lines(_ file: String) -> [JSON] {
        let text = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }
    }
}

/// The tus server (`tus_server.py`: tuspyserver under uvicorn), with its request log.
public final class TusServer {
    public let peer: PythonPeer
    public let files: String
    public let logFile: String

    public init(directory: String) throws {
        files = directory + "/tus-files"
        logFile = directory + "/tus-requests.jsonl"
        try FileManager.default.createDirectory(atPath: files, withIntermediateDirectories: true)
        FileManager.default.createFile(atPath: logFile, contents: nil)
        peer = try PythonPeer(script: "tus_server.py", arguments: ["--files", files, "--log", logFile])
    }

    public var creationURL: String { "http://127.0.0.1:\(peer.port)/files" }
    public var requests: [JSON] { PythonPeer.lines(logFile) }

    /// The uploads the server holds (their data files).
    public var uploads: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: files)) ?? []).filter { !$0.hasSuffix(".info") && !$0.hasPrefix(".") }
            .map { files + "/" + $0 }
    }
}
