import Foundation
import JSONCodec

/// A proxy in front of a real peer that lies (`hostile_proxy.py`): each request reaches the peer,
/// and its answer comes back mutated at `rate` (seeded): duplicated and broken headers, offsets
/// negative, backwards or past the size, a `Location` on another scheme, truncated and oversized
/// bodies, floods of 104s, bodies that never end, garbage status lines, stalls, dropped
/// connections. Every answer is logged with its mutation.
public final class HostileProxy {
    public let peer: PythonPeer
    public let logFile: String

    /// `stall`: how long a stalled answer or an endless body lasts (longer than the request
    /// timeout under test).
    public init(target: UInt16, directory: String, name: String, seed: UInt64, rate: Double, stall: Double = 30) throws {
        logFile = directory + "/hostile-\(name).jsonl"
        peer = try PythonPeer(
            script: "hostile_proxy.py",
            arguments: [
                "--target", String(target), "--seed", String(seed), "--rate", String(rate), "--stall", String(stall),
                "--log", logFile,
            ])
    }

    public var port: UInt16 { peer.port }
    public func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }

    /// The answers given, each `{method, path, status, mutation}` (mutation null: passed as it was).
    public var answers: [JSON] { PythonPeer.lines(logFile) }
    public var mutations: Int { answers.filter { $0["mutation"]?.stringValue != nil }.count }
}
