/// Collects one response from an easy handle: status, headers (of the last response, after any
/// 100 Continue) and up to `bodyLimit` bytes of body. Its owner keeps it alive with the handle.
public final class ResponseCollector {
    public private(set) var status = 0
    public private(set) var headers: [(String, String)] = []
    public private(set) var body: [UInt8] = []
    public let bodyLimit: Int
    /// Called with the status and headers of each informational (1xx) response once its header
    /// block has ended, before the final response (libcurl hands their lines to the header
    /// callback too). Survives `reset`.
    public var onInformational: ((Int, [(String, String)]) -> Void)?

    public init(bodyLimit: Int) { self.bodyLimit = bodyLimit }

    /// Routes the handle's header and data callbacks here.
    public func attach(to easy: EasyHandle) {
        easy.onHeaderLine = { [unowned self] line in receive(line) }
        easy.onData = { [unowned self] bytes in
            append(bytes)
            return true
        }
    }

    /// Keeps body bytes up to the limit (for handlers that route the data callback elsewhere).
    public func append(_ bytes: UnsafeRawBufferPointer) {
        let room = bodyLimit - body.count
        if room > 0 { body.append(contentsOf: bytes.prefix(room)) }
    }

    public func reset() {
        status = 0
        headers = []
        body = []
    }

    /// The last value of a header (case-insensitive name).
    public func header(_ name: String) -> String? {
        let lower = name.lowercased()
        return headers.last(where: { $0.0.lowercased() == lower })?.1
    }

    private func receive(_ line: String) {
        // "\r\n" is one Character in Swift: trim by scalars.
        var scalars = Substring(line).unicodeScalars
        while let last = scalars.last, last == "\r" || last == "\n" { scalars.removeLast() }
        let text = String(scalars)
        if text.isEmpty {
            // The end of a header block: an informational response is complete.
            if (100..<200).contains(status) {
                onInformational?(status, headers)
                // No final response yet: a transfer that ends here has no status.
                status = 0
                headers = []
            }
            return
        }
        if text.hasPrefix("HTTP/") {
            let parts = text.split(separator: " ", maxSplits: 2)
            status = parts.count > 1 ? Int(parts[1]) ?? 0 : 0
            headers = []
            body = []
        } else if let colon = text.firstIndex(of: ":") {
            let value = text[text.index(after: colon)...].drop(while: { $0 == " " || $0 == "\t" })
            headers.append((String(text[..<colon]), String(value)))
        }
    }
}

/// A request body held in memory, read (and rewound) by curl through an easy handle.
public final class MemoryBody {
    public private(set) var bytes: [UInt8]
    private var offset = 0

    public init(_ bytes: [UInt8] = []) { self.bytes = bytes }

    public func replace(with bytes: [UInt8]) {
        self.bytes = bytes
        offset = 0
    }

    /// Routes the handle's read and seek callbacks here.
    public func attach(to easy: EasyHandle) {
        easy.readBody = { [unowned self] buffer in
            let count = min(buffer.count, bytes.count - offset)
            if count > 0 {
                bytes.withUnsafeBytes { source in
                    buffer.baseAddress!.copyMemory(from: source.baseAddress! + offset, byteCount: count)
                }
                offset += count
            }
            return .bytes(count)
        }
        easy.seekBody = { [unowned self] position in
            guard position >= 0, position <= Int64(bytes.count) else { return false }
            offset = Int(position)
            return true
        }
    }
}
