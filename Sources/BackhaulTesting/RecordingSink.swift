import BackhaulCore
import Foundation
import MicroHTTP
import Threads

/// An HTTP server on 127.0.0.1 (or another loopback address) that records every request (method, path, headers, the exact
/// body bytes in a file) and misbehaves on cue: status codes, dropped connections, stalls,
/// throttled reads. One thread per connection, so stalls and throttles block only their request.
public final class RecordingSink: Sendable {
    /// What the sink does with one request. Queued behaviours are used in order; then `fallback`.
    public enum Behaviour: Sendable {
        case respond(status: Int, headers: [(String, String)] = [], body: String = "")
        /// Close the connection after this many body bytes, without answering.
        case drop(afterBytes: Int64)
        /// Read the body, then wait this long before answering `status`.
        case stall(seconds: Double, status: Int)
        /// Read the body at most this fast, then behave as `then`.
        indirect case throttle(bytesPerSecond: Int, then: Behaviour)
        /// Take the body as `then` would (a resumable sink keeps it), wait this long, then answer
        /// as `then`: a slow server that loses nothing.
        indirect case delayed(seconds: Double, then: Behaviour)
        /// A resumable Content-Range server: each chunk is written at its offset into the path's
        /// assembled file; intermediate chunks get 308 with `Range: bytes=0-n`, the last 201;
        /// `Content-Range: bytes */total` asks for the current range.
        case resumable
        /// In a script: this request gets the fallback behaviour.
        case passThrough
        /// A server failing `rate` of its requests at random (seeded): 503, 429 with
        /// `Retry-After: 1`, a connection dropped mid-body, a stall of `stall` seconds before
        /// answering as `then` would, or the whole body taken and no answer sent; otherwise `then`.
        indirect case flaky(rate: Double, seed: UInt64, stall: Double, then: Behaviour)
    }

    /// How many faults a `.flaky` sink injected, by kind.
    public var faults: [String: Int] { state.withLock { $0.faults } }

    public struct Recorded: Sendable {
        public var index: Int
        public var method: String
        public var path: String
        public var query: [String: String]
        public var headers: [String: String]
        /// Trailers after a chunked body (names lower-cased).
        public var trailers: [String: String] = [:]
        public var bodyFile: String
        public var bodyLength: Int64
        /// The whole body arrived and an answer was sent.
        public var answered: Bool
        public var status: Int?
        public var startedAt: Double
        public var endedAt: Double?

        public var body: Data { (try? Data(contentsOf: URL(fileURLWithPath: bodyFile))) ?? Data() }
    }

    private struct State {
        var script: [Behaviour] = []
        var records: [Recorded] = []
        var inFlight = 0
        var maxInFlight = 0
        var random: UInt64 = 0
        var faults: [String: Int] = [:]
    }

    private let state = Locked(State())
    private let fallback: Locked<Behaviour>
    private let directory: String
    private nonisolated(unsafe) var server: Daemon!
    public let host: String

    public var port: UInt16 { server.port }
    public func url(_ path: String) -> String { "http://\(host):\(port)\(path)" }

    /// `port`: a fixed port (a state fixture's sink); 0 picks a free one. `host`: the loopback
    /// address it listens on (127.0.0.2 is another host to an allow-list).
    public init(
        directory: String, fallback: Behaviour = .respond(status: 201, body: "{\"ok\":true}"),
        port: UInt16 = 0, host: String = "127.0.0.1"
    ) throws {
        self.directory = directory
        self.host = host
        self.fallback = Locked(fallback)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        server = try Daemon(
            host: host, port: port, threading: .threadPerConnection, connectionTimeoutSeconds: 60,
            handler: Handler(sink: self))
    }

    deinit { server?.stop() }

    public func stop() { server.stop() }

    /// Queues behaviours for the next requests, in order.
    public func enqueue(_ behaviours: Behaviour...) { state.withLock { $0.script += behaviours } }

    public func setFallback(_ behaviour: Behaviour) { fallback.withLock { $0 = behaviour } }

    public var requests: [Recorded] { state.withLock { $0.records } }
    public var maxConcurrentRequests: Int { state.withLock { $0.maxInFlight } }
    public var totalBodyBytes: Int64 { requests.reduce(0) { $0 + $1.bodyLength } }

    public func reset() {
        state.withLock {
            $0.script = []
            $0.records = []
            $0.maxInFlight = $0.inFlight
        }
    }

    /// The file a resumable upload to `path` has assembled so far.
    public func assembled(_ path: String) -> Data {
        FileManager.default.contents(atPath: assembledPath(path)) ?? Data()
    }

    fileprivate func assembledPath(_ path: String) -> String {
        directory + "/assembled" + path.replacingOccurrences(of: "/", with: "_")
    }

    fileprivate func begin(_ head: HTTPRequestHead) -> (Int, Behaviour, FileHandle?) {
        var behaviour: Behaviour =
            state.withLock { $0.script.isEmpty ? nil : $0.script.removeFirst() } ?? fallback.withLock { $0 }
        if case .passThrough = behaviour { behaviour = fallback.withLock { $0 } }
        if case .flaky(let rate, let seed, let stall, let then) = behaviour {
            behaviour = state.withLock { state in
                if state.random == 0 { state.random = seed | 1 }
                func next() -> Double {
                    state.random ^= state.random << 13
                    state.random ^= state.random >> 7
                    state.random ^= state.random << 17
                    return Double(state.random >> 11) / Double(1 << 53)
                }
                guard next() < rate else { return then }
                let faults: [(String, Behaviour)] = [
                    ("503", .respond(status: 503)), ("429", .respond(status: 429, headers: [("Retry-After", "1")])),
                    ("drop", .drop(afterBytes: Int64(next() * 200_000))), ("stall", .delayed(seconds: stall, then: then)),
                    ("no_answer", .drop(afterBytes: .max)),
                ]
                let (name, fault) = faults[min(faults.count - 1, Int(next() * Double(faults.count)))]
                state.faults[name, default: 0] += 1
                return fault
            }
        }
        let index: Int = state.withLock { state in
            state.inFlight += 1
            state.maxInFlight = max(state.maxInFlight, state.inFlight)
            let index = state.records.count
            state.records.append(
                Recorded(
                    index: index, method: head.method, path: head.path, query: head.query, headers: head.headers,
                    bodyFile: "\(directory)/\(index).body", bodyLength: 0, answered: false, status: nil,
                    startedAt: Date().timeIntervalSince1970, endedAt: nil))
            return index
        }
        let file = "\(directory)/\(index).body"
        _ = FileManager.default.createFile(atPath: file, contents: nil)
        return (index, behaviour, FileHandle(forWritingAtPath: file))
    }

    fileprivate func trailers(_ index: Int, _ trailers: [String: String]) {
        state.withLock { $0.records[index].trailers = trailers }
    }

    fileprivate func received(_ index: Int, bytes: Int) {
        state.withLock { $0.records[index].bodyLength += Int64(bytes) }
    }

    fileprivate func end(_ index: Int, status: Int?) {
        state.withLock { state in
            state.inFlight -= 1
            state.records[index].answered = status != nil
            state.records[index].status = status
            state.records[index].endedAt = Date().timeIntervalSince1970
        }
    }

    private struct Handler: StreamingHTTPHandler {
        let sink: RecordingSink
        func begin(_ head: HTTPRequestHead) -> any RequestBodyConsumer {
            let (index, behaviour, file) = sink.begin(head)
            return Consumer(sink: sink, head: head, index: index, behaviour: behaviour, file: file)
        }
    }

    private final class Consumer: RequestBodyConsumer {
        let sink: RecordingSink
        let index: Int
        var behaviour: Behaviour
        var throttle: Int?
        var delay = 0.0
        let file: FileHandle?
        let head: HTTPRequestHead
        var received: Int64 = 0
        var ended = false
        /// For `.resumable`: the parsed Content-Range and the assembled file.
        var range: (first: Int64, last: Int64, total: Int64)?
        var assembled: FileHandle?

        init(sink: RecordingSink, head: HTTPRequestHead, index: Int, behaviour: Behaviour, file: FileHandle?) {
            self.sink = sink
            self.head = head
            self.index = index
            self.file = file
            self.behaviour = behaviour
            unwrapping: while true {
                switch self.behaviour {
                case .throttle(let rate, let then):
                    throttle = rate
                    self.behaviour = then
                case .delayed(let seconds, let then):
                    delay = seconds
                    self.behaviour = then
                default: break unwrapping
                }
            }
            if case .resumable = self.behaviour, let header = head.headers["content-range"] {
                range = Self.parseContentRange(header)
                let path = sink.assembledPath(head.path)
                if !FileManager.default.fileExists(atPath: path) {
                    _ = FileManager.default.createFile(atPath: path, contents: nil)
                }
                if let range, range.first >= 0 {
                    assembled = FileHandle(forWritingAtPath: path)
                    assembled?.seek(toFileOffset: UInt64(range.first))
                }
            }
        }

        /// `bytes a-b/total` → (a, b, total); `bytes */total` → (-1, -1, total).
        static func parseContentRange(_ header: String) -> (first: Int64, last: Int64, total: Int64)? {
            guard header.hasPrefix("bytes ") else { return nil }
            let parts = header.dropFirst(6).split(separator: "/")
            guard parts.count == 2, let total = Int64(parts[1]) else { return nil }
            if parts[0] == "*" { return (-1, -1, total) }
            let bounds = parts[0].split(separator: "-")
            guard bounds.count == 2, let first = Int64(bounds[0]), let last = Int64(bounds[1]) else { return nil }
            return (first, last, total)
        }

        /// The answer of a resumable server to this request, after its body.
        func resumableAnswer() -> HTTPResponse {
            try? assembled?.synchronize()
            try? assembled?.close()
            let size = (try? FileManager.default.attributesOfItem(atPath: sink.assembledPath(head.path))[.size] as? Int64) ?? 0
            guard let range else { return HTTPResponse(status: 201) }
            if size >= range.total { return HTTPResponse(status: 201, body: Array("{\"ok\":true}".utf8)) }
            return HTTPResponse(status: 308, headers: size > 0 ? [("Range", "bytes=0-\(size - 1)")] : [])
        }

        deinit {
            try? file?.close()
            try? assembled?.close()
            if !ended { sink.end(index, status: nil) }
        }

        func consume(_ bytes: UnsafeRawBufferPointer) -> BodyDisposition {
            if case .drop(let limit) = behaviour, received + Int64(bytes.count) >= limit {
                let keep = Int(max(0, limit - received))
                write(UnsafeRawBufferPointer(rebasing: bytes[0..<keep]))
                ended = true
                sink.end(index, status: nil)
                return .drop
            }
            write(bytes)
            if let throttle, throttle > 0 {
                usleep(UInt32(min(2.0, Double(bytes.count) / Double(throttle)) * 1_000_000))
            }
            return .continue
        }

        private func write(_ bytes: UnsafeRawBufferPointer) {
            guard bytes.count > 0 else { return }
            file?.write(Data(bytes))
            assembled?.write(Data(bytes))
            received += Int64(bytes.count)
            sink.received(index, bytes: bytes.count)
        }

        func receivedTrailers(_ trailers: [String: String]) { sink.trailers(index, trailers) }

        func finish() -> HTTPResponse? {
            try? file?.synchronize()
            if delay > 0 { usleep(UInt32(delay * 1_000_000)) }
            ended = true
            switch behaviour {
            case .respond(let status, let headers, let body):
                sink.end(index, status: status)
                return HTTPResponse(status: status, headers: headers, body: Array(body.utf8))
            case .stall(let seconds, let status):
                usleep(UInt32(seconds * 1_000_000))
                sink.end(index, status: status)
                return HTTPResponse(status: status)
            case .drop:
                sink.end(index, status: nil)
                return nil
            case .resumable:
                let answer = resumableAnswer()
                sink.end(index, status: answer.status)
                return answer
            case .throttle, .delayed, .passThrough, .flaky:
                sink.end(index, status: 201)
                return HTTPResponse(status: 201)
            }
        }
    }
}
