import Foundation
import BackhaulCore
import MicroHTTP

/// An HTTP server on 127.0.0.1 that records every request (method, path, headers, the exact
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
    }

    public struct Recorded: Sendable {
        public var index: Int
        public var method: String
        public var path: String
        public var query: [String: String]
        public var headers: [String: String]
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
    }

    private let state = Locked(State())
    private let fallback: Locked<Behaviour>
    private let directory: String
    private nonisolated(unsafe) var server: Daemon!

    public var port: UInt16 { server.port }
    public func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }

    public init(directory: String, fallback: Behaviour = .respond(status: 201, body: "{\"ok\":true}")) throws {
        self.directory = directory
        self.fallback = Locked(fallback)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        server = try Daemon(host: "127.0.0.1", port: 0, threading: .threadPerConnection, connectionTimeoutSeconds: 60,
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

    fileprivate func begin(_ head: HTTPRequestHead) -> (Int, Behaviour, FileHandle?) {
        let behaviour: Behaviour = state.withLock { $0.script.isEmpty ? nil : $0.script.removeFirst() } ?? fallback.withLock { $0 }
        let index: Int = state.withLock { state in
            state.inFlight += 1
            state.maxInFlight = max(state.maxInFlight, state.inFlight)
            let index = state.records.count
            state.records.append(Recorded(
                index: index, method: head.method, path: head.path, query: head.query, headers: head.headers,
                bodyFile: "\(directory)/\(index).body", bodyLength: 0, answered: false, status: nil,
                startedAt: Date().timeIntervalSince1970, endedAt: nil))
            return index
        }
        let file = "\(directory)/\(index).body"
        FileManager.default.createFile(atPath: file, contents: nil)
        return (index, behaviour, FileHandle(forWritingAtPath: file))
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
            return Consumer(sink: sink, index: index, behaviour: behaviour, file: file)
        }
    }

    private final class Consumer: RequestBodyConsumer {
        let sink: RecordingSink
        let index: Int
        var behaviour: Behaviour
        var throttle: Int?
        let file: FileHandle?
        var received: Int64 = 0
        var ended = false

        init(sink: RecordingSink, index: Int, behaviour: Behaviour, file: FileHandle?) {
            self.sink = sink
            self.index = index
            self.file = file
            self.behaviour = behaviour
            while case .throttle(let rate, let then) = self.behaviour {
                throttle = rate
                self.behaviour = then
            }
        }

        deinit {
            try? file?.close()
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
            received += Int64(bytes.count)
            sink.received(index, bytes: bytes.count)
        }

        func finish() -> HTTPResponse? {
            try? file?.synchronize()
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
            case .throttle:
                sink.end(index, status: 201)
                return HTTPResponse(status: 201)
            }
        }
    }
}
