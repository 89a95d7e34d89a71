import Curl
import Foundation
import JSONCodec

/// A scratch directory removed when the value is released.
public final class TemporaryDirectory: Sendable {
    public let path: String

    public init(_ name: String = "backhaul-test") {
        let template = NSTemporaryDirectory() + "\(name)-XXXXXX"
        var bytes = Array(template.utf8CString)
        path = bytes.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    public func file(_ name: String) -> String { "\(path)/\(name)" }

    /// Writes `size` pseudo-random bytes (a fixed seed per name) and returns the path.
    @discardableResult
    public func makeFile(_ name: String, size: Int) -> String {
        let path = file(name)
        var generator = SeededGenerator(seed: UInt64(truncatingIfNeeded: name.hashValue) | 1)
        _ = FileManager.default.createFile(atPath: path, contents: nil)
        let handle = FileHandle(forWritingAtPath: path)!
        var remaining = size
        while remaining > 0 {
            let count = min(remaining, 1 << 20)
            var chunk = [UInt8](repeating: 0, count: count)
            for index in stride(from: 0, to: count, by: 8) {
                var value = generator.next()
                withUnsafeBytes(of: &value) { word in
                    for offset in 0..<min(8, count - index) { chunk[index + offset] = word[offset] }
                }
            }
            handle.write(Data(chunk))
            remaining -= count
        }
        try? handle.close()
        return path
    }
}

struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return state
    }
}

/// Waits until `condition` holds, polling; false when `timeout` passes first.
@discardableResult
public func eventually(timeout: Double = 20, interval: Double = 0.05, _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if try condition() { return true }
        Thread.sleep(forTimeInterval: interval)
    }
    return try condition()
}

/// A `backhauld` process started from the build folder, driven over HTTP, killed on cue.
public final class DaemonProcess {
    public let stateDirectory: String
    public let logFile: String
    public private(set) var port: UInt16 = 0
    private var process: Process?
    private let extraArguments: [String]
    private let allowedRoot: String
    private let client: HTTPClient

    /// The daemon binary: beside the test bundle, or `BACKHAUL_BINARY`.
    public static var binary: String {
        if let path = ProcessInfo.processInfo.environment["BACKHAUL_BINARY"] { return path }
        let executable =
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        return URL(fileURLWithPath: executable).deletingLastPathComponent().appendingPathComponent("backhauld").path
    }

    /// The routing table the daemon reads (a fixture: a wired default route, so tests do not
    /// depend on the machine's network); `setDefaultRoute` changes it.
    public let routeFile: String

    /// `environment`: variables added to the daemon's (an AWS credential source, say).
    public init(
        stateDirectory: String, allowedRoot: String, arguments: [String] = [], environment: [String: String] = [:]
    ) throws {
        self.environment = environment
        self.stateDirectory = stateDirectory
        self.logFile = stateDirectory + ".log"
        self.routeFile = stateDirectory + ".route"
        try Self.routeTable(defaultInterface: "eth0").write(toFile: routeFile, atomically: true, encoding: .utf8)
        self.allowedRoot = allowedRoot
        self.extraArguments = arguments
        self.client = try HTTPClient()
        try start()
    }

    deinit {
        if let process, process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    /// A `/proc/net/route` table whose default route goes through `defaultInterface` (none: no
    /// default route).
    public static func routeTable(defaultInterface: String?) -> String {
        var table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        table += "lo\t0000007F\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n"
        if let defaultInterface { table += "\(defaultInterface)\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n" }
        return table
    }

    /// Moves the default route, as a modem coming up or a cable pulled would.
    public func setDefaultRoute(_ interface: String?) throws {
        try Self.routeTable(defaultInterface: interface).write(toFile: routeFile, atomically: true, encoding: .utf8)
    }

    public var pid: Int32 { process?.processIdentifier ?? 0 }
    /// The exit status of the last process, once it has ended (nil while it runs).
    public var exitStatus: Int32? {
        guard let process, !process.isRunning else { return nil }
        return process.terminationStatus
    }
    public var isRunning: Bool { process?.isRunning ?? false }
    /// Variables added to the test's own environment for the processes started from now on (a
    /// preload library that injects faults, say).
    public var environment: [String: String] = [:]

    /// Starts the daemon on a free port and waits until it listens.
    public func start() throws {
        let startLine = (try? String(contentsOfFile: logFile, encoding: .utf8))?.split(separator: "\n").count ?? 0
        if !FileManager.default.fileExists(atPath: logFile) { _ = FileManager.default.createFile(atPath: logFile, contents: nil) }
        let logHandle = FileHandle(forWritingAtPath: logFile)!
        logHandle.seekToEndOfFile()
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.binary)
        process.arguments =
            [
                "--listen", "127.0.0.1:0", "--state-dir", stateDirectory, "--allow-root", allowedRoot,
                "--log-level", "debug", "--route-file", routeFile,
            ]
            // The machine's own system bus is not the test's: the routing table fixture unless a
            // test names a source (a private bus with dbusmock, say).
            + (extraArguments.contains("--network-source") ? [] : ["--network-source", "routing-table"]) + extraArguments
        process.standardError = logHandle
        process.standardOutput = logHandle
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        try process.run()
        self.process = process
        var found: UInt16?
        eventually(timeout: 20) {
            let lines = ((try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "").split(separator: "\n").dropFirst(
                startLine)
            for line in lines where line.contains("\"msg\":\"listening\"") {
                if let value = try? JSON.parse(String(line)), let text = value["http.port"]?.stringValue { found = UInt16(text) }
            }
            return found != nil || !process.isRunning
        }
        guard let found else { throw DaemonError(message: "backhauld did not start; log:\n\(log(lastLines: 30))") }
        port = found
    }

    public struct DaemonError: Error, CustomStringConvertible {
        public var message: String
        public var description: String { message }
    }

    /// SIGKILL, and wait for the process to be gone.
    public func kill9() {
        guard let process else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// Waits for the process to end by itself; its exit status, or nil if it still ran after `timeout`.
    public func waitForExit(timeout: Double = 30) -> Int32? {
        guard let process, eventually(timeout: timeout, { !process.isRunning }) else { return nil }
        return process.terminationStatus
    }

    /// SIGTERM; the exit status, or nil if it did not exit within `timeout` (by default 60 s: the
    /// engine's grace of 10 s and the other steps on a machine that runs many tests at once). A
    /// daemon that did not stop has its threads' stacks and its log's end printed (to find where a
    /// stop hangs from a CI run's output), and is then killed so that the test can go on.
    public func terminate(timeout: Double = 60) -> Int32? {
        guard let process else { return nil }
        kill(process.processIdentifier, SIGTERM)
        guard eventually(timeout: timeout, { !process.isRunning }) else {
            print(hangReport(pid: process.processIdentifier, after: timeout))
            kill9()
            return nil
        }
        return process.terminationStatus
    }

    /// Every thread's stack (gdb, when the machine has it) and the log's last lines.
    private func hangReport(pid: Int32, after seconds: Double) -> String {
        var report = "backhauld (pid \(pid)) still ran \(seconds) s after SIGTERM; the end of its log:\n\(log(lastLines: 40))\n"
        if FileManager.default.isExecutableFile(atPath: "/usr/bin/gdb") {
            let gdb = Process()
            gdb.executableURL = URL(fileURLWithPath: "/usr/bin/gdb")
            gdb.arguments = ["-batch", "-nx", "-p", "\(pid)", "-ex", "thread apply all bt 30"]
            let pipe = Pipe()
            gdb.standardOutput = pipe
            gdb.standardError = pipe
            if (try? gdb.run()) != nil {
                let output = pipe.fileHandleForReading.readDataToEndOfFile()
                gdb.waitUntilExit()
                report += "its threads:\n" + String(decoding: output, as: UTF8.self)
            }
        }
        return report
    }

    public func log(lastLines count: Int = 40) -> String {
        let lines = ((try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "").split(separator: "\n")
        return lines.suffix(count).joined(separator: "\n")
    }

    public var url: String { "http://127.0.0.1:\(port)" }

    /// One API call; the status and the parsed body (null when empty or not JSON).
    @discardableResult
    public func call(
        _ method: String, _ path: String, _ body: JSON? = nil, headers: [String] = [],
        timeout: Int = 30
    ) throws -> (Int, JSON) {
        let exchange = try client.send(
            method, url + path, headers: headers, body: body.map { $0.serializedBytes() },
            timeoutSeconds: timeout)
        return (exchange.status, (try? JSON.parse(exchange.body, maxDepth: 64)) ?? .null)
    }

    /// Sends raw bytes as a body (for malformed input tests).
    public func callRaw(_ method: String, _ path: String, body: [UInt8]) throws -> (Int, JSON) {
        let exchange = try client.send(method, url + path, body: body)
        return (exchange.status, (try? JSON.parse(exchange.body, maxDepth: 64)) ?? .null)
    }

    public func task(_ id: String) throws -> JSON { try call("GET", "/v1/tasks/\(id)").1 }

    /// A GET whose answer is text (`/metrics`).
    public func callText(_ path: String) throws -> String {
        String(decoding: try client.send("GET", url + path, timeoutSeconds: 30).body, as: UTF8.self)
    }

    /// Waits until the task reaches `state` (or any final state when nil); returns it.
    @discardableResult
    public func waitForTask(_ id: String, state: String? = nil, timeout: Double = 30) throws -> JSON {
        var last: JSON = .null
        let finals: Set<String> = ["completed", "failed", "cancelled"]
        eventually(timeout: timeout, interval: 0.05) {
            last = (try? task(id)) ?? .null
            let current = last["state"]?.stringValue ?? ""
            return state.map { $0 == current } ?? finals.contains(current)
        }
        return last
    }
}
