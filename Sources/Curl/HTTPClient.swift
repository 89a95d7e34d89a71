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
    private var responseHeaders: [(String, String)] = []
    private var responseBody: [UInt8] = []
    private var requestBody: [UInt8] = []
    private var requestOffset = 0

    public init() throws(CurlCode) {
        easy = try EasyHandle()
        easy.onHeaderLine = { [unowned self] line in
            var scalars = Substring(line).unicodeScalars
            while let last = scalars.last, last == "\r" || last == "\n" { scalars.removeLast() }
            let text = String(scalars)
            if text.hasPrefix("HTTP/") {
                responseHeaders = []
            } else if let colon = text.firstIndex(of: ":") {
                let value = text[text.index(after: colon)...].drop(while: { $0 == " " })
                responseHeaders.append((String(text[..<colon]), String(value)))
            }
        }
        easy.onData = { [unowned self] bytes in
            responseBody.append(contentsOf: bytes)
            return true
        }
        easy.readBody = { [unowned self] buffer in
            let count = min(buffer.count, requestBody.count - requestOffset)
            if count > 0 {
                requestBody.withUnsafeBytes { source in
                    buffer.baseAddress!.copyMemory(from: source.baseAddress! + requestOffset, byteCount: count)
                }
                requestOffset += count
            }
            return .bytes(count)
        }
        easy.seekBody = { [unowned self] offset in
            guard offset >= 0, offset <= Int64(requestBody.count) else { return false }
            requestOffset = Int(offset)
            return true
        }
    }

    /// Sends one request and waits for the whole response.
    public func send(_ method: String, _ url: String, headers: [String] = [], body: [UInt8]? = nil,
                     timeoutSeconds: Int = 30) throws(CurlCode) -> HTTPExchange {
        curl_easy_reset(easy.raw)
        try easy.reinstallCallbacks()
        responseHeaders = []
        responseBody = []
        requestBody = body ?? []
        requestOffset = 0
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
        return HTTPExchange(status: easy.responseCode, headers: responseHeaders, body: responseBody)
    }
}
