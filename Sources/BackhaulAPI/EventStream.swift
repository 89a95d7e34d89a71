import BackhaulCore
import BackhaulQueue
import MicroHTTP
import Threads

/// Wakes event streams when a write adds events, and ends them at shutdown.
public final class EventFeed: Sendable {
    private struct State {
        var generation: UInt64 = 0
        var closed = false
    }

    private let state = Locked(State())

    public init() {}

    /// New events were committed.
    public func notify() { state.withLockNotifyingAll { $0.generation &+= 1 } }

    /// Ends every stream (shutdown).
    public func close() { state.withLockNotifyingAll { $0.closed = true } }

    var generation: UInt64 { state.withLock { $0.generation } }

    /// Waits for an event after `generation`, at most `timeout` seconds; false once closed.
    func wait(after generation: UInt64, timeout: Double) -> Bool {
        state.wait(until: { $0.generation != generation || $0.closed }, timeout: timeout) { !$0.closed }
    }
}

/// `GET /v1/events`: Server-Sent Events from the event log, resumable by sequence number.
/// Runs on its connection's own thread (the API serves one thread per connection), so it may
/// block while it waits for events.
final class EventStream: ResponseStream, @unchecked Sendable {
    // @unchecked: libmicrohttpd calls `read` from the connection's one thread only.
    private let store: any StateStore
    private let feed: EventFeed
    private let session: String?
    /// For a client token streaming without `?session=`: the sessions it may see.
    private let visible: (@Sendable (String) -> Bool)?
    private var cursor: Int64
    private var buffer: [UInt8]
    private var offset = 0
    static let keepAliveSeconds = 15.0

    init(
        store: any StateStore, feed: EventFeed, session: String?, visible: (@Sendable (String) -> Bool)? = nil,
        after cursor: Int64
    ) {
        self.store = store
        self.feed = feed
        self.session = session
        self.visible = visible
        self.cursor = cursor
        buffer = Array("retry: 2000\n: connected\n\n".utf8)
    }

    func read(into destination: UnsafeMutableRawBufferPointer) -> StreamChunk {
        while offset >= buffer.count {
            buffer = []
            offset = 0
            let generation = feed.generation
            guard let events = try? store.events(after: cursor, session: session, limit: 200) else { return .error }
            if let last = events.last {
                // Events of sessions the caller may not see are passed over, not waited on.
                cursor = last.sequence
                for event in events where visible?(event.sessionID) ?? true { buffer += Self.format(event) }
                if buffer.isEmpty { continue }
                break
            }
            guard feed.wait(after: generation, timeout: Self.keepAliveSeconds) else { return .end }
            if feed.generation == generation { buffer = Array(": keep-alive\n\n".utf8) }
        }
        let count = min(destination.count, buffer.count - offset)
        buffer.withUnsafeBytes { source in
            destination.baseAddress!.copyMemory(from: source.baseAddress! + offset, byteCount: count)
        }
        offset += count
        return .bytes(count)
    }

    static func format(_ event: EventRecord) -> [UInt8] {
        Array("id: \(event.sequence)\nevent: \(event.type)\ndata: \(event.payloadText)\n\n".utf8)
    }
}
