import Foundation
import Glibc
import JSONCodec

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

    /// `port`: a fixed port (a state fixture's peers); nil picks a free one.
    public init(script name: String, arguments: [String], port: UInt16? = nil, start: Bool = true) throws {
        self.port = try port ?? freePort()
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

    /// The body bytes of the logged requests with this method (`content_length` of each line).
    public static func bodyBytes(_ requests: [JSON], method: String) -> Int64 {
        requests.filter { $0["method"]?.stringValue == method }.reduce(Int64(0)) { $0 + ($1["content_length"]?.intValue ?? 0) }
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

    /// `failPatch`: the Nth PATCH (1-based) is answered 503 and not stored. `checksum`: the server
    /// offers the checksum extension and answers 460 to a PATCH that does not match it.
    /// `corruptPatch`: one byte of the Nth PATCH body is flipped on its way in.
    /// `lockedAfterHead`: the first N PATCHes after the first HEAD are answered `423 Locked` (the
    /// lock of a request whose client died, as a restarted client meets it).
    /// `port`: a fixed port (a state fixture's peers); nil picks a free one.
    public init(
        directory: String, failPatch: Int = 0, checksum: Bool = false, corruptPatch: Int = 0, lockedAfterHead: Int = 0,
        port: UInt16? = nil
    ) throws {
        files = directory + "/tus-files"
        logFile = directory + "/tus-requests.jsonl"
        try FileManager.default.createDirectory(atPath: files, withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: logFile, contents: nil)
        peer = try PythonPeer(
            script: "tus_server.py",
            arguments: [
                "--files", files, "--log", logFile, "--fail-patch", String(failPatch), "--corrupt-patch", String(corruptPatch),
                "--locked-after-head", String(lockedAfterHead),
            ] + (checksum ? ["--checksum"] : []), port: port)
    }

    public var creationURL: String { "http://127.0.0.1:\(peer.port)/files" }
    public var requests: [JSON] { PythonPeer.lines(logFile) }

    /// The uploads the server holds (their data files).
    public var uploads: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: files)) ?? []).filter {
            !$0.hasSuffix(".info") && !$0.hasPrefix(".")
        }
        .map { files + "/" + $0 }
    }
}

extension TusServer {
    /// The uploads by the filename their metadata names (tuspyserver keeps `<uid>.info` beside
    /// each upload).
    public var uploadsByFilename: [String: [String]] {
        var map: [String: [String]] = [:]
        for path in uploads {
            guard let info = FileManager.default.contents(atPath: path + ".info"), let json = try? JSON.parse(Array(info)),
                let name = json["metadata"]?["filename"]?.stringValue
            else { continue }
            map[name, default: []].append(path)
        }
        return map
    }
}

/// S3 (`s3_server.py`: moto checking SigV4 signatures, an IAM user of its own, one bucket),
/// with its request log.
public final class S3Server {
    public let peer: PythonPeer
    public let logFile: String
    public let credentials: JSON
    public let credentialsFile: String

    /// `failPart`: the Nth UploadPart (1-based) is answered 503. `corruptPart`: one byte of the
    /// Nth UploadPart body is flipped on its way in (the server checks `x-amz-checksum-sha256`).
    /// `numericETags`: ListParts writes the ETags' quotes as `&#34;` and `&#x22;`.
    public init(directory: String, failPart: Int = 0, corruptPart: Int = 0, numericETags: Bool = false) throws {
        logFile = directory + "/s3-requests.jsonl"
        let credentialsFile = directory + "/s3-credentials.json"
        self.credentialsFile = credentialsFile
        _ = FileManager.default.createFile(atPath: logFile, contents: nil)
        peer = try PythonPeer(
            script: "s3_server.py",
            arguments: [
                "--credentials", credentialsFile, "--log", logFile, "--fail-part", String(failPart), "--corrupt-part",
                String(corruptPart),
            ] + (numericETags ? ["--numeric-etags"] : []))
        var loaded: JSON?
        eventually(timeout: 30) {
            loaded = FileManager.default.contents(atPath: credentialsFile).flatMap { try? JSON.parse(Array($0)) }
            return loaded != nil
        }
        guard let loaded else { throw NginxServer.NginxError(message: "moto did not set up its user and bucket") }
        credentials = loaded
    }

    public var bucket: String { credentials["bucket"]?.stringValue ?? "" }

    /// The ARN of the role `edge` that `aws_credentials.py` makes in this moto (with the user's
    /// policy that allows everything): for web identity's `AWS_ROLE_ARN`.
    public func roleARN() throws -> String {
        let process = Process()
        let output = Pipe()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", PythonPeer.script("aws_credentials.py"), "--role", "--s3", credentialsFile]
        process.standardOutput = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }
    public func objectURL(_ key: String) -> String { "http://127.0.0.1:\(peer.port)/\(bucket)/\(key)" }

    /// The `s3` object of a task.
    public var taskCredentials: JSON {
        [
            "region": credentials["region"] ?? "us-east-1", "access_key_id": credentials["access_key_id"] ?? "",
            "secret_access_key": credentials["secret_access_key"] ?? "",
        ]
    }

    public var requests: [JSON] { PythonPeer.lines(logFile) }

    /// The multipart uploads the server holds open (`ListMultipartUploads`, asked with boto3):
    /// key and upload id of each; nil when the listing failed.
    public func openMultipartUploads() -> [(key: String, uploadID: String)]? {
        let script = """
            import json, os, sys, boto3
            os.environ.pop("AWS_CA_BUNDLE", None)
            c = json.load(open(sys.argv[1]))
            s3 = boto3.client("s3", endpoint_url=c["endpoint"], region_name=c["region"],
                              aws_access_key_id=c["access_key_id"], aws_secret_access_key=c["secret_access_key"])
            uploads = s3.list_multipart_uploads(Bucket=c["bucket"]).get("Uploads", [])
            print(json.dumps([[u["Key"], u["UploadId"]] for u in uploads]))
            """
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", script, credentialsFile]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return nil }
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0, let list = try? JSON.parse(Array(data)).arrayValue else { return nil }
        return list.compactMap { pair in
            guard let key = pair.arrayValue?.first?.stringValue, let id = pair.arrayValue?.last?.stringValue else { return nil }
            return (key, id)
        }
    }

    /// Downloads an object with the curl CLI signing for itself (an independent client).
    public func object(_ key: String) -> Data {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        let user = "\(credentials["access_key_id"]?.stringValue ?? ""):\(credentials["secret_access_key"]?.stringValue ?? "")"
        process.arguments = [
            "-sf", "--aws-sigv4", "aws:amz:us-east-1:s3", "-u", user, "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
            objectURL(key),
        ]
        let output = Pipe()
        process.standardOutput = output
        try? process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return data
    }
}

/// A TCP proxy in front of a peer that holds uploads to `rate` bytes a second
/// (`throttle_proxy.py`): a slow uplink; stopping it drops the link.
public final class ThrottleProxy {
    public let peer: PythonPeer

    /// `rate` 0: no limit. `holdAnswers`: each answer waits that many seconds before it goes back
    /// (a request the server acted on, whose answer the client may never see).
    public init(target: UInt16, rate: Int, holdAnswers: Double = 0) throws {
        peer = try PythonPeer(
            script: "throttle_proxy.py",
            arguments: [
                "--target", String(target), "--rate", String(rate), "--hold-answers", String(holdAnswers),
            ])
    }

    public var port: UInt16 { peer.port }
}

/// The Prometheus client library's parser (`parse_metrics.py`): `name{label=value,…}` → value.
public enum PrometheusParser {
    public struct ParseFailed: Error, CustomStringConvertible {
        public var description: String
    }

    public static func parse(_ text: String) throws -> [String: Double] {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", PythonPeer.script("parse_metrics.py")]
        let input = Pipe()
        let output = Pipe()
        let errors = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        input.fileHandleForWriting.write(Data(text.utf8))
        try input.fileHandleForWriting.close()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        let problem = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0, let object = try JSON.parse(Array(data)).objectValue else {
            throw ParseFailed(description: String(decoding: problem, as: UTF8.self))
        }
        var result: [String: Double] = [:]
        for (key, value) in object { result[key] = value.doubleValue }
        return result
    }
}

/// The download peer (`download_server.py`): serves files with ETag and Last-Modified, honours
/// Range and If-Range, and misbehaves on cue; logs every request.
public final class DownloadServer {
    public let peer: PythonPeer
    public let root: String
    public let logFile: String

    public struct Faults {
        public var dropAfter = 0
        public var dropTimes = 0
        public var ignoreRange = false
        public var ignoreIfRange = false
        public var bytesPerSecond = 0
        /// Bodies without Content-Length, ended by closing the connection: the size is unknown
        /// until the end.
        public var noLength = false
        /// When a body is dropped, the served file of that name is first replaced (atomically) by
        /// the file at the path: the retry is certain to find it changed.
        public var replaceOnDrop: (name: String, with: String)?
        public init(
            dropAfter: Int = 0, dropTimes: Int = 0, ignoreRange: Bool = false, ignoreIfRange: Bool = false,
            bytesPerSecond: Int = 0, noLength: Bool = false, replaceOnDrop: (name: String, with: String)? = nil
        ) {
            self.dropAfter = dropAfter
            self.dropTimes = dropTimes
            self.ignoreRange = ignoreRange
            self.ignoreIfRange = ignoreIfRange
            self.bytesPerSecond = bytesPerSecond
            self.noLength = noLength
            self.replaceOnDrop = replaceOnDrop
        }
    }

    public init(directory: String, faults: Faults = Faults(), port: UInt16? = nil) throws {
        root = directory + "/served"
        logFile = directory + "/download-requests.jsonl"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: logFile, contents: nil)
        var arguments = [
            "--root", root, "--log", logFile, "--drop-after", String(faults.dropAfter),
            "--drop-times", String(faults.dropTimes), "--rate", String(faults.bytesPerSecond),
        ]
        if faults.ignoreRange { arguments.append("--ignore-range") }
        if faults.ignoreIfRange { arguments.append("--ignore-if-range") }
        if faults.noLength { arguments.append("--no-length") }
        if let (name, path) = faults.replaceOnDrop { arguments += ["--replace-on-drop", "\(name)=\(path)"] }
        peer = try PythonPeer(script: "download_server.py", arguments: arguments, port: port)
    }

    public func url(_ name: String) -> String { "http://127.0.0.1:\(peer.port)/\(name)" }
    public var requests: [JSON] { PythonPeer.lines(logFile) }
    /// Body bytes the server sent, over every request.
    public var bytesTransferred: Int64 { requests.reduce(Int64(0)) { $0 + ($1["bytes"]?.intValue ?? 0) } }
}
