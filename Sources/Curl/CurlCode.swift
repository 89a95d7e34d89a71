internal import CCurl

/// A libcurl easy result code (`CURLcode`) with curl's own message for it.
public struct CurlCode: RawRepresentable, Error, Sendable, Equatable, CustomStringConvertible {
    public var rawValue: UInt32
    /// The handle's error buffer when the transfer failed, else `curl_easy_strerror`.
    public var message: String

    public init(rawValue: UInt32) {
        self.rawValue = rawValue
        self.message = String(cString: curl_easy_strerror(CURLcode(rawValue)))
    }

    init(_ code: CURLcode, message: String? = nil) {
        self.init(rawValue: code.rawValue)
        if let message, !message.isEmpty { self.message = message }
    }

    public static func == (lhs: CurlCode, rhs: CurlCode) -> Bool { lhs.rawValue == rhs.rawValue }

    public static let ok = CurlCode(CURLE_OK)
    public static let couldNotResolveHost = CurlCode(CURLE_COULDNT_RESOLVE_HOST)
    public static let couldNotResolveProxy = CurlCode(CURLE_COULDNT_RESOLVE_PROXY)
    public static let couldNotConnect = CurlCode(CURLE_COULDNT_CONNECT)
    public static let operationTimedOut = CurlCode(CURLE_OPERATION_TIMEDOUT)
    public static let sendError = CurlCode(CURLE_SEND_ERROR)
    public static let receiveError = CurlCode(CURLE_RECV_ERROR)
    public static let gotNothing = CurlCode(CURLE_GOT_NOTHING)
    public static let partialFile = CurlCode(CURLE_PARTIAL_FILE)
    public static let abortedByCallback = CurlCode(CURLE_ABORTED_BY_CALLBACK)
    public static let readError = CurlCode(CURLE_READ_ERROR)
    public static let writeError = CurlCode(CURLE_WRITE_ERROR)
    public static let sslConnectError = CurlCode(CURLE_SSL_CONNECT_ERROR)
    public static let peerFailedVerification = CurlCode(CURLE_PEER_FAILED_VERIFICATION)
    public static let sslCACert = CurlCode(CURLE_SSL_CACERT_BADFILE)
    public static let unsupportedProtocol = CurlCode(CURLE_UNSUPPORTED_PROTOCOL)
    public static let malformedURL = CurlCode(CURLE_URL_MALFORMAT)
    public static let http2 = CurlCode(CURLE_HTTP2)
    public static let http2Stream = CurlCode(CURLE_HTTP2_STREAM)
    public static let weirdServerReply = CurlCode(CURLE_WEIRD_SERVER_REPLY)
    public static let sendFailRewind = CurlCode(CURLE_SEND_FAIL_REWIND)
    public static let outOfMemory = CurlCode(CURLE_OUT_OF_MEMORY)

    public var description: String { "curl error \(rawValue): \(message)" }
}

/// A libcurl multi result code (`CURLMcode`).
public struct CurlMultiCode: RawRepresentable, Error, Sendable, CustomStringConvertible {
    public var rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public var description: String {
        "curl multi error \(rawValue): \(String(cString: curl_multi_strerror(CURLMcode(rawValue))))"
    }
}

@inline(__always)
func check(_ code: CURLcode, _ handle: EasyHandle? = nil) throws(CurlCode) {
    guard code == CURLE_OK else { throw CurlCode(code, message: handle?.errorBufferText) }
}

@inline(__always)
func check(_ code: CURLMcode) throws(CurlMultiCode) {
    guard code == CURLM_OK else { throw CurlMultiCode(rawValue: code.rawValue) }
}

/// `curl_global_init`, once per process, before any handle is made.
public enum CurlGlobal {
    private static let initialized: Bool = { curl_global_init(Int(CURL_GLOBAL_DEFAULT)) == CURLE_OK }()
    public static func initialize() { _ = initialized }
    /// The libcurl version string (`curl_version`).
    public static var version: String { String(cString: curl_version()) }
}
