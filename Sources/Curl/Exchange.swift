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

    /// One header line as libcurl hands it over (CRLF included), read as bytes: the status line
    /// of a response, one of its headers, or the empty line that ends its header block.
    private func receive(_ line: UnsafeRawBufferPointer) {
        var end = line.count
        while end > 0, line[end - 1] == UInt8(ascii: "\r") || line[end - 1] == UInt8(ascii: "\n") { end -= 1 }
        guard end > 0 else {
            // The end of a header block: an informational response is complete.
            if (100..<200).contains(status) {
                onInformational?(status, headers)
                // No final response yet: a transfer that ends here has no status.
                status = 0
                headers = []
            }
            return
        }
        let text = UnsafeRawBufferPointer(rebasing: line[..<end])
        if text.starts(with: "HTTP/".utf8) {
            // "HTTP/1.1 200 OK": three digits after the version and its spaces, else no status.
            var index = text.firstIndex(of: UInt8(ascii: " ")) ?? end
            while index < end, text[index] == UInt8(ascii: " ") { index += 1 }
            var code = 0
            var digits = 0
            while index < end, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(text[index]), digits < 4 {
                code = code * 10 + Int(text[index] - UInt8(ascii: "0"))
                digits += 1
                index += 1
            }
            if digits != 3 || index < end && text[index] != UInt8(ascii: " ") { code = 0 }
            status = code
            headers = []
            body = []
        } else if let colon = text.firstIndex(of: UInt8(ascii: ":")) {
            var start = colon + 1
            while start < end, text[start] == UInt8(ascii: " ") || text[start] == UInt8(ascii: "\t") { start += 1 }
            headers.append(
                (
                    String(decoding: UnsafeRawBufferPointer(rebasing: text[..<colon]), as: UTF8.self),
                    String(decoding: UnsafeRawBufferPointer(rebasing: text[start..<end]), as: UTF8.self)
                ))
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
