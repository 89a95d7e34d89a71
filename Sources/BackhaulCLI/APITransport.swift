import Curl

/// One request as the client sends it: the full URL, header lines, a JSON body.
public struct APIRequest: Sendable, Equatable {
    public var method: String
    public var url: String
    public var headers: [String]
    public var body: [UInt8]?

    public init(method: String, url: String, headers: [String] = [], body: [UInt8]? = nil) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
    }
}

/// The status and body of an answer.
public struct APIResponse: Sendable, Equatable {
    public var status: Int
    public var body: [UInt8]

    public init(status: Int, body: [UInt8]) {
        self.status = status
        self.body = body
    }
}

/// How the client's requests travel: libcurl for the command line, canned answers in tests.
/// A thrown `reason` is the transport's own message; the client adds where it was going.
public protocol APITransport: AnyObject {
    func send(_ request: APIRequest) throws(TransportReason) -> APIResponse

    /// A GET whose body is handed to `receive` as it arrives until `receive` or `tick` (called
    /// about once a second while nothing arrives) returns false, or the stream ends; then the
    /// answer so far. A status other than 2xx is not streamed: its body is in the answer.
    func stream(_ request: APIRequest, receive: @escaping (UnsafeRawBufferPointer) -> Bool, tick: @escaping () -> Bool)
        throws(TransportReason) -> APIResponse
}

/// Why a transport gave no answer, in its own words.
public struct TransportReason: Error, Sendable, Equatable {
    public var message: String
    public init(_ message: String) { self.message = message }
}

/// libcurl through `HTTPClient`: one handle reused for calls, and one of its own for each
/// stream, so a stream's callbacks may call the API meanwhile.
public final class CurlTransport: APITransport {
    private var client: HTTPClient?

    public init() {}

    public func send(_ request: APIRequest) throws(TransportReason) -> APIResponse {
        do {
            let http = try client ?? HTTPClient()
            client = http
            let exchange = try http.send(request.method, request.url, headers: request.headers, body: request.body)
            return APIResponse(status: exchange.status, body: exchange.body)
        } catch {
            throw TransportReason("\(error)")
        }
    }

    public func stream(_ request: APIRequest, receive: @escaping (UnsafeRawBufferPointer) -> Bool, tick: @escaping () -> Bool)
        throws(TransportReason) -> APIResponse
    {
        do {
            let exchange = try HTTPClient().stream(request.url, headers: request.headers, receive: receive, tick: tick)
            return APIResponse(status: exchange.status, body: exchange.body)
        } catch {
            throw TransportReason("\(error)")
        }
    }
}
