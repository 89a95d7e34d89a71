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

/// How the client's requests travel: libcurl (`CurlTransport`) unless told otherwise. A thrown
/// `reason` is the transport's own message; the client adds where it was going.
public protocol APITransport: Sendable {
    /// Sends one request and waits for the whole answer, without holding the caller's thread.
    func send(_ request: APIRequest) async throws(TransportReason) -> APIResponse

    /// A GET whose body is handed to `receive` as it arrives, until the server ends it or the
    /// calling task is cancelled (which ends it promptly, not as an error); then the answer so
    /// far. A status other than 2xx is not streamed: its body is in the answer.
    func stream(_ request: APIRequest, receive: @escaping @Sendable ([UInt8]) -> Void) async throws(TransportReason)
        -> APIResponse
}

/// Why a transport gave no answer, in its own words.
public struct TransportReason: Error, Sendable, Equatable {
    public var message: String
    public init(_ message: String) { self.message = message }
}
