import Threads

/// `GET /v1/events` as an async sequence of `APIEvent`. Each iteration opens its own stream
/// (on a thread of its own). Iteration throws `APIError.problem` when the daemon refuses the
/// stream and `.transport` when it never opened. Once open, it ends (`nil`) when the daemon
/// ends it or the connection breaks; resume with `BackhaulClient.events(after:)` and the last
/// event's `id` to miss nothing. Cancelling the iterating task, or leaving the loop, closes the
/// stream within about a second.
public struct APIEventStream: AsyncSequence, Sendable {
    public typealias Element = APIEvent
    public typealias Failure = APIError

    let request: APIRequest
    let transport: any APITransport
    let baseURL: String

    public func makeAsyncIterator() -> Iterator {
        let (stream, continuation) = AsyncThrowingStream<APIEvent, any Error>.makeStream()
        let producer = Task { [request, transport, baseURL] in
            let parser = Locked(ServerSentEventParser())
            let opened = Locked(false)
            do throws(TransportReason) {
                let response = try await transport.stream(request) { bytes in
                    opened.withLock { $0 = true }
                    for event in parser.withLock({ $0.feed(bytes) }) { continuation.yield(APIEvent(event)) }
                }
                guard (200..<300).contains(response.status) else {
                    continuation.finish(throwing: APIError.problem(APIProblem(status: response.status, body: response.body)))
                    return
                }
                continuation.finish()
            } catch {
                // A stream that broke after it opened has ended; one that never opened is out of reach.
                let failure = APIError.transport(TransportFailure(baseURL: baseURL, reason: error.message))
                opened.withLock { $0 } ? continuation.finish() : continuation.finish(throwing: failure)
            }
        }
        continuation.onTermination = { _ in producer.cancel() }
        return Iterator(base: stream.makeAsyncIterator())
    }

    /// Reads one stream; errors are `APIError`.
    public struct Iterator: AsyncIteratorProtocol {
        var base: AsyncThrowingStream<APIEvent, any Error>.Iterator

        public mutating func next() async throws(APIError) -> APIEvent? {
            do {
                return try await base.next()
            } catch {
                throw error as? APIError ?? .transport(TransportFailure(baseURL: "", reason: "\(error)"))
            }
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async throws(APIError) -> APIEvent? {
            do {
                return try await base.next(isolation: actor)
            } catch {
                throw error as? APIError ?? .transport(TransportFailure(baseURL: "", reason: "\(error)"))
            }
        }
    }
}

extension APIEvent {
    /// The event stream's framing done, this reads the envelope (`{"type", "timestamp", "data"}`);
    /// an event whose data cannot be read still counts as an event, without its task.
    public init(_ event: ServerSentEvent) {
        struct Envelope<Data: Decodable>: Decodable {
            var timestamp: String?
            var data: Data?
        }
        let bytes = Array(event.data.utf8)
        self.init(id: event.id, type: event.type)
        if event.type.hasPrefix("task.") {
            let envelope = try? decodeJSON(Envelope<APITask>.self, bytes)
            timestamp = envelope?.timestamp
            task = envelope?.data
        } else if event.type == "session.drained" {
            let envelope = try? decodeJSON(Envelope<SessionDrained>.self, bytes)
            timestamp = envelope?.timestamp
            drained = envelope?.data
        } else {
            timestamp = (try? decodeJSON(Envelope<APIValue>.self, bytes))?.timestamp
        }
    }
}
