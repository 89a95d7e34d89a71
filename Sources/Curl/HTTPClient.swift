import CCurl

/// A finished exchange of the blocking client.
public struct HTTPExchange: Sendable {
    public var status: Int
    /// Header names as received; the last response's only.
    public var headers: [(String, String)]
    public var body: [UInt8]

    public func header(_ name: String) -> String? {
        headers.last(where: { $0.0.lowercased() == name.lowercased() })?.1
    }
}

/// A small blocking HTTP client over one reused easy handle (`curl_easy_perform`), for the CLI
/// and tests. Not Sendable: one per thread.
public final class HTTPClient {
    private let easy: EasyHandle
    private let response = ResponseCollector(bodyLimit: Int.max)
    private let requestBody = MemoryBody()

    public init() throws(CurlCode) {
        easy = try EasyHandle()
        try attach()
    }

    private func attach() throws(CurlCode) {
        response.attach(to: easy)
        requestBody.attach(to: easy)
    }

    /// Sends one request and waits for the whole response.
    public func send(_ method: String, _ url: String, headers: [String] = [], body: [UInt8]? = nil,
                     timeoutSeconds: Int = 30) throws(CurlCode) -> HTTPExchange {
        try easy.reset()
        response.reset()
        requestBody.replace(with: body ?? [])
        try easy.set(CURLOPT_URL, url)
        try easy.set(CURLOPT_NOSIGNAL, 1)
        try easy.set(CURLOPT_TIMEOUT, timeoutSeconds)
        switch (method, body) {
        case ("GET", nil): try easy.set(CURLOPT_HTTPGET, 1)
        case ("HEAD", _): try easy.set(CURLOPT_NOBODY, 1)
        case (_, .some(let bytes)):
            try easy.set(CURLOPT_UPLOAD, 1)
            try easy.set(CURLOPT_INFILESIZE_LARGE, offset: Int64(bytes.count))
            try easy.set(CURLOPT_CUSTOMREQUEST, method)
        default:
            try easy.set(CURLOPT_CUSTOMREQUEST, method)
        }
        var lines = headers
        if body != nil, !lines.contains(where: { $0.lowercased().hasPrefix("content-type:") }) {
            lines.append("Content-Type: application/json")
        }
        lines.append("Expect:")
        try easy.setHeaders(lines)
        easy.clearError()
        let code = curl_easy_perform(easy.raw)
        guard code == CURLE_OK else { throw easy.error(for: code) }
        return HTTPExchange(status: easy.responseCode, headers: response.headers, body: response.body)
    }
}
