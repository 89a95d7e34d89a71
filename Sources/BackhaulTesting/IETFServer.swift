import Foundation
import Glibc
import JSONCodec

/// Apple's server side of IETF resumable uploads (`NIOResumableUpload` from swift-nio-extras) in
/// the test peer `Tests/IETFPeer`, on a port of its own: writes finished uploads to a folder, logs
/// each exchange as a JSON line, and can be killed and started again on the same port. `make test`
/// builds it into `.build-ietfpeer` (`make ietf-peer`); `BACKHAUL_IETF_PEER` names another binary.
public final class IETFServer {
    public let port: UInt16
    public let directory: String
    public let logFile: String
    private let arguments: [String]
    private var process: Process?

    public static var binary: String {
        if let path = ProcessInfo.processInfo.environment["BACKHAUL_IETF_PEER"] { return path }
        return URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent(".build-ietfpeer/debug/IETFPeer").path
    }

    /// `origin`: the scheme and authority of the upload resource URLs the peer hands out (a proxy
    /// in front of it); `versions`: the interop versions it takes (others are refused with 400
    /// naming its newest); `timeout`: seconds an interrupted upload waits for its resumption;
    /// `wantDigest`: OPTIONS asks for `Repr-Digest` and a mismatch is refused; `corruptAt`: the byte
    /// at that offset of each upload is flipped on its way in.
    public init(
        directory: String, port: UInt16? = nil, origin: String? = nil, versions: [Int] = [3, 5, 6],
        timeout: Int? = nil, wantDigest: Bool = false, corruptAt: Int64? = nil, start: Bool = true
    ) throws {
        self.port = try port ?? freePort()
        self.directory = directory + "/ietf"
        logFile = directory + "/ietf-requests.jsonl"
        try FileManager.default.createDirectory(atPath: self.directory, withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: logFile, contents: nil)
        var arguments = [
            "--port", String(self.port), "--dir", self.directory, "--log", logFile,
            "--versions", versions.map(String.init).joined(separator: ","),
        ]
        if let origin { arguments += ["--origin", origin] }
        if let timeout { arguments += ["--timeout", String(timeout)] }
        if wantDigest { arguments.append("--want-digest") }
        if let corruptAt { arguments += ["--corrupt-at", String(corruptAt)] }
        self.arguments = arguments
        if start { try self.start() }
    }

    deinit { stop() }

    public func start() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.binary) else {
            throw NginxServer.NginxError(message: "the IETF test peer is not built (\(Self.binary)): run `make ietf-peer`")
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.binary)
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        self.process = process
        let port = self.port
        guard eventually(timeout: 20, { (try? connectable(port: port)) == true || !process.isRunning }), process.isRunning else {
            throw NginxServer.NginxError(message: "the IETF test peer did not start")
        }
    }

    /// SIGKILL: every upload it held is gone with it (Apple's handler keeps them in memory).
    public func stop() {
        guard let process, process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        self.process = nil
    }

    public func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }

    /// One JSON object per exchange: `method`, `path`, `status`, `informational`, `location`,
    /// `content_length` (body bytes received), the resumable-upload request headers, `aborted`.
    public var requests: [JSON] { PythonPeer.lines(logFile) }

    /// Finished uploads (paths).
    public var uploads: [String] { files(in: "uploads") }

    /// Bytes of the uploads being received (what Apple's handler passed on so far).
    public var partialBytes: Int64 {
        files(in: "partial").reduce(Int64(0)) { total, path in
            total + ((try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int64) ?? 0)
        }
    }

    public var partialUploads: [String] { files(in: "partial") }

    private func files(in folder: String) -> [String] {
        let path = directory + "/" + folder
        return ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted().map { path + "/" + $0 }
    }
}
