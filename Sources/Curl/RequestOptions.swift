internal import CCurl

/// One request as the callers of this module describe it, with no libcurl type in sight:
/// `EasyHandle.configure` turns it into `curl_easy_setopt` calls. The body's bytes come through
/// the handle's callbacks (`readBody`, the MIME part) or from memory.
public struct RequestOptions: Sendable {
    public enum Method: Sendable, Equatable {
        case get, head, put, post
        case custom(String)

        public init(_ name: String) {
            switch name {
            case "GET": self = .get
            case "HEAD": self = .head
            case "PUT": self = .put
            case "POST": self = .post
            default: self = .custom(name)
            }
        }
    }

    public enum Body: Sendable, Equatable {
        case none
        /// Read through `EasyHandle.readBody`: `length` bytes, or chunked transfer encoding when nil.
        case stream(length: Int64?)
        /// A body set up with `EasyHandle.setMultipartBody` (its length is curl's to compute).
        case multipart
    }

    public var url: String
    public var method: Method
    public var headers: [String] = []
    public var body: Body = .none
    /// Follow 3xx answers (off: a redirect is the answer).
    public var followRedirects = false
    public var userAgent: String?
    /// The whole exchange's time limit, seconds (nil: none).
    public var timeoutSeconds: Int?
    public var connectTimeoutMilliseconds: Int?
    public var tcpKeepAlive = false
    /// A connection of its own, closed after the request (`CURLOPT_FRESH_CONNECT`,
    /// `CURLOPT_FORBID_REUSE`): the socket options and `EasyHandle.tcpInfo` are this request's.
    public var ownConnection = false
    /// curl's upload and download buffers (nil: its defaults).
    public var uploadBufferSize: Int?
    public var receiveBufferSize: Int?
    /// Pace the body sent or received (bytes/s; nil or 0: no limit).
    public var maxSendSpeed: Int64?
    public var maxReceiveSpeed: Int64?
    /// A CA bundle instead of the system's.
    public var caBundle: String?
    /// AWS Signature V4 (`CURLOPT_AWS_SIGV4`), computed by curl over the headers it sends.
    public var awsSigV4: AWSSigning?
    /// Allow HTTP/2 over TLS (ALPN) and multiplexing on a shared connection; plain http stays
    /// HTTP/1.1 (no prior knowledge). An https transfer that finds its host's connection still in
    /// its handshake waits for it (`CURLOPT_PIPEWAIT`) instead of opening one of its own: a burst
    /// of small uploads to an HTTP/2 server goes as streams of one connection, with one handshake.
    /// A server that answers HTTP/1.1 costs the burst that one handshake's wait, then each
    /// transfer has a connection of its own as before.
    public var allowHTTP2 = true

    public struct AWSSigning: Sendable, Equatable {
        public var region: String
        public var service: String
        public var accessKeyID: String
        public var secretAccessKey: String

        public init(region: String, service: String = "s3", accessKeyID: String, secretAccessKey: String) {
            self.region = region
            self.service = service
            self.accessKeyID = accessKeyID
            self.secretAccessKey = secretAccessKey
        }
    }

    public init(url: String, method: Method) {
        self.url = url
        self.method = method
    }
}

extension EasyHandle {
    /// Sets every option of `request` on this handle (fresh from `init`).
    public func configure(_ request: RequestOptions) throws(CurlCode) {
        try set(CURLOPT_URL, request.url)
        try set(CURLOPT_NOSIGNAL, 1)
        try set(CURLOPT_PROTOCOLS_STR, "http,https")
        try set(CURLOPT_FOLLOWLOCATION, request.followRedirects ? 1 : 0)
        if !request.allowHTTP2 {
            try set(CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_1_1))
        } else if request.url.utf8.prefix(8).elementsEqual("https://".utf8, by: { $0 | 0x20 == $1 }) {
            // The scheme in any case (`|0x20` lower-cases letters and leaves ':' and '/' as they are).
            try set(CURLOPT_PIPEWAIT, 1)
        }
        if request.tcpKeepAlive { try set(CURLOPT_TCP_KEEPALIVE, 1) }
        if request.ownConnection {
            try set(CURLOPT_FRESH_CONNECT, 1)
            try set(CURLOPT_FORBID_REUSE, 1)
        }
        if let agent = request.userAgent { try set(CURLOPT_USERAGENT, agent) }
        if let seconds = request.timeoutSeconds { try set(CURLOPT_TIMEOUT, seconds) }
        if let milliseconds = request.connectTimeoutMilliseconds { try set(CURLOPT_CONNECTTIMEOUT_MS, milliseconds) }
        if let size = request.uploadBufferSize { try set(CURLOPT_UPLOAD_BUFFERSIZE, size) }
        if let size = request.receiveBufferSize { try set(CURLOPT_BUFFERSIZE, size) }
        if let speed = request.maxSendSpeed, speed > 0 { try setSendSpeedLimit(speed) }
        if let speed = request.maxReceiveSpeed, speed > 0 { try setReceiveSpeedLimit(speed) }
        if let bundle = request.caBundle { try set(CURLOPT_CAINFO, bundle) }
        if let signing = request.awsSigV4 {
            try set(CURLOPT_AWS_SIGV4, "aws:amz:\(signing.region):\(signing.service)")
            try set(CURLOPT_USERPWD, "\(signing.accessKeyID):\(signing.secretAccessKey)")
        }
        switch request.body {
        case .none:
            switch request.method {
            case .get: try set(CURLOPT_HTTPGET, 1)
            case .head: try set(CURLOPT_NOBODY, 1)
            case .put: try set(CURLOPT_CUSTOMREQUEST, "PUT")
            case .post: try set(CURLOPT_CUSTOMREQUEST, "POST")
            case .custom(let name): try set(CURLOPT_CUSTOMREQUEST, name)
            }
        case .stream(let length):
            try set(CURLOPT_UPLOAD, 1)
            if let length { try set(CURLOPT_INFILESIZE_LARGE, offset: length) }
            if request.method != .put { try set(CURLOPT_CUSTOMREQUEST, request.method.name) }
        case .multipart:
            if request.method != .post { try set(CURLOPT_CUSTOMREQUEST, request.method.name) }
        }
        try setHeaders(request.headers)
    }

    /// Paces what this transfer sends, in flight too (0 lifts it).
    public func setSendSpeedLimit(_ bytesPerSecond: Int64) throws(CurlCode) {
        try set(CURLOPT_MAX_SEND_SPEED_LARGE, offset: bytesPerSecond)
    }

    /// Paces what this transfer receives, in flight too (0 lifts it).
    public func setReceiveSpeedLimit(_ bytesPerSecond: Int64) throws(CurlCode) {
        try set(CURLOPT_MAX_RECV_SPEED_LARGE, offset: bytesPerSecond)
    }
}

extension RequestOptions.Method {
    public var name: String {
        switch self {
        case .get: return "GET"
        case .head: return "HEAD"
        case .put: return "PUT"
        case .post: return "POST"
        case .custom(let name): return name
        }
    }
}
