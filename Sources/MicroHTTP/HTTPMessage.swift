/// The head of an HTTP request, before its body.
public struct HTTPRequestHead: Sendable {
    public var method: String
    /// The path, percent-decoded by libmicrohttpd, without the query.
    public var path: String
    /// Query arguments, decoded; the last one wins for repeated names.
    public var query: [String: String]
    /// Header names lower-cased; repeated headers joined with ", ".
    public var headers: [String: String]

    public init(method: String, path: String, query: [String: String] = [:], headers: [String: String] = [:]) {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
    }

    public var contentLength: Int64? { headers["content-length"].flatMap { Int64($0) } }
}

/// A request with its whole body, as the buffering API handlers see it.
public struct HTTPRequest: Sendable {
    public var head: HTTPRequestHead
    public var body: [UInt8]

    public init(head: HTTPRequestHead, body: [UInt8] = []) {
        self.head = head
        self.body = body
    }

    public init(
        method: String, path: String, query: [String: String] = [:], headers: [String: String] = [:],
        body: [UInt8] = []
    ) {
        self.init(head: HTTPRequestHead(method: method, path: path, query: query, headers: headers), body: body)
    }

    public var method: String { head.method }
    public var path: String { head.path }
    public var query: [String: String] { head.query }
    public func header(_ name: String) -> String? { head.headers[name.lowercased()] }
}

/// What a streaming response source produces on each call.
public enum StreamChunk {
    /// Bytes were written into the buffer.
    case bytes(Int)
    /// The response is complete.
    case end
    /// Abort the connection.
    case error
}

/// A response body source called from libmicrohttpd's thread (thread-per-connection mode may block).
public protocol ResponseStream: AnyObject, Sendable {
    func read(into buffer: UnsafeMutableRawBufferPointer) -> StreamChunk
}

public enum HTTPBody: Sendable {
    case bytes([UInt8])
    case stream(any ResponseStream)
}

public struct HTTPResponse: Sendable {
    public var status: Int
    public var headers: [(String, String)]
    public var body: HTTPBody

    public init(status: Int, headers: [(String, String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = .bytes(body)
    }

    public init(status: Int, headers: [(String, String)] = [], stream: any ResponseStream) {
        self.status = status
        self.headers = headers
        self.body = .stream(stream)
    }

    public var bodyBytes: [UInt8] {
        if case .bytes(let bytes) = body { return bytes }
        return []
    }

    public func header(_ name: String) -> String? {
        headers.first(where: { $0.0.lowercased() == name.lowercased() })?.1
    }
}

/// What a body consumer says after each piece of the request body.
public enum BodyDisposition: Sendable {
    case `continue`
    /// Answer now without reading the rest of the body (the connection is closed after).
    case respond(HTTPResponse)
    /// Close the connection without an answer (tests use this to drop connections on cue).
    case drop
}

/// Receives one request's body as it arrives and answers at the end. One per request.
public protocol RequestBodyConsumer: AnyObject {
    func consume(_ bytes: UnsafeRawBufferPointer) -> BodyDisposition
    /// The body is complete: the answer, or nil to close the connection without one.
    func finish() -> HTTPResponse?
    /// Trailers that followed a chunked body (names lower-cased), just before `finish`.
    func receivedTrailers(_ trailers: [String: String])
}

extension RequestBodyConsumer {
    public func receivedTrailers(_ trailers: [String: String]) {}
}

/// A server's request handler: makes a body consumer for each request head.
public protocol StreamingHTTPHandler: Sendable {
    func begin(_ head: HTTPRequestHead) -> any RequestBodyConsumer
}

/// A handler that sees whole requests, with a body size limit (413 past it).
public struct BufferingHandler: StreamingHTTPHandler {
    public var maxBodyBytes: Int
    public var handle: @Sendable (HTTPRequest) -> HTTPResponse
    public var tooLarge: @Sendable (HTTPRequestHead, Int) -> HTTPResponse

    public init(
        maxBodyBytes: Int, tooLarge: @escaping @Sendable (HTTPRequestHead, Int) -> HTTPResponse,
        handle: @escaping @Sendable (HTTPRequest) -> HTTPResponse
    ) {
        self.maxBodyBytes = maxBodyBytes
        self.handle = handle
        self.tooLarge = tooLarge
    }

    public func begin(_ head: HTTPRequestHead) -> any RequestBodyConsumer {
        Buffer(head: head, handler: self)
    }

    /// Past this much discarded body the connection is closed instead of read to the end.
    static let discardLimit = 64 << 20

    private final class Buffer: RequestBodyConsumer {
        let head: HTTPRequestHead
        let handler: BufferingHandler
        var body: [UInt8] = []
        var discarded = 0

        init(head: HTTPRequestHead, handler: BufferingHandler) {
            self.head = head
            self.handler = handler
        }

        /// An oversized body is read and dropped, so the client gets its 413 after sending
        /// (answering mid-body closes the connection under it); a huge one is cut off.
        func consume(_ bytes: UnsafeRawBufferPointer) -> BodyDisposition {
            if discarded > 0 || body.count + bytes.count > handler.maxBodyBytes {
                discarded += body.count + bytes.count
                body = []
                if discarded > BufferingHandler.discardLimit { return .respond(handler.tooLarge(head, handler.maxBodyBytes)) }
                return .continue
            }
            body.append(contentsOf: bytes)
            return .continue
        }

        func finish() -> HTTPResponse? {
            if discarded > 0 {
                return handler.tooLarge(head, handler.maxBodyBytes)
            }
            return handler.handle(HTTPRequest(head: head, body: body))
        }
    }
}
