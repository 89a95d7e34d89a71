internal import CCurl

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
    public func send(
        _ method: String, _ url: String, headers: [String] = [], body: [UInt8]? = nil,
        timeoutSeconds: Int = 30
    ) throws(CurlCode) -> HTTPExchange {
        try prepare(url, timeoutSeconds: timeoutSeconds)
        requestBody.replace(with: body ?? [])
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
        try perform()
        return HTTPExchange(status: easy.responseCode, headers: response.headers, body: response.body)
    }

    /// A GET whose body is handed to `receive` as it arrives (a stream such as server-sent events),
    /// with no overall time limit. `tick` is called about once a second while nothing arrives.
    /// Either returning false ends the exchange, which is then not an error. A status other than
    /// 2xx is not streamed: its body is kept in the answer.
    public func stream(
        _ url: String, headers: [String] = [], receive: @escaping (UnsafeRawBufferPointer) -> Bool,
        tick: @escaping () -> Bool
    ) throws(CurlCode) -> HTTPExchange {
        try prepare(url, timeoutSeconds: 0)
        try easy.set(CURLOPT_HTTPGET, 1)
        try easy.set(CURLOPT_CONNECTTIMEOUT, 10)
        try easy.setHeaders(headers)
        var stopped = false
        easy.onData = { [unowned self] bytes in
            guard (200..<300).contains(response.status) else {
                response.append(bytes)
                return true
            }
            stopped = !receive(bytes)
            return !stopped
        }
        easy.onProgress = { _, _ in
            stopped = stopped || !tick()
            return !stopped
        }
        defer {
            easy.onProgress = nil
            response.attach(to: easy)
        }
        do {
            try perform()
        } catch  where stopped {
            // Ended by `receive` or `tick`: the answer so far is the answer.
        }
        return HTTPExchange(status: easy.responseCode, headers: response.headers, body: response.body)
    }

    private func prepare(_ url: String, timeoutSeconds: Int) throws(CurlCode) {
        try easy.reset()
        response.reset()
        try easy.set(CURLOPT_URL, url)
        try easy.set(CURLOPT_NOSIGNAL, 1)
        try easy.set(CURLOPT_TIMEOUT, timeoutSeconds)
    }

    private func perform() throws(CurlCode) {
        easy.clearError()
        let code = curl_easy_perform(easy.raw)
        guard code == CURLE_OK else { throw easy.error(for: code) }
    }
}
