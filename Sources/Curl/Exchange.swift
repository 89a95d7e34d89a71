/// Collects one response from an easy handle: status, headers (of the last response, after any
/// 100 Continue) and up to `bodyLimit` bytes of body. Its owner keeps it alive with the handle.
///
/// The header lines stay bytes, one after another in one buffer that is kept from response to
/// response: their Strings are made when `headers` is first read. Only its own methods touch its
/// properties, one call at a time, on the thread that owns the handle: no runtime exclusivity
/// checks.
public final class ResponseCollector {
    @exclusivity(unchecked) public private(set) var status = 0
    @exclusivity(unchecked) public private(set) var body: [UInt8] = []
    public let bodyLimit: Int
    /// Called when the header block of an informational (1xx) response has ended, before the
    /// final response (libcurl hands their lines to the header callback too), with this collector
    /// showing that response's status and headers. Survives `reset`.
    public var onInformational: ((ResponseCollector) -> Void)?

    /// The current response's header lines as received, CRLF cut off; `fields` says where in them
    /// each name and value is.
    @exclusivity(unchecked) private var lines: [UInt8] = []
    @exclusivity(unchecked) private var fields: [Field] = []
    /// `headers`, once made: the engine reads the headers twice (lower-cased for the protocol,
    /// as received for the record), and their values are the same strings.
    @exclusivity(unchecked) private var decoded: [(String, String)]?

    /// One header: its name as written and its value without the blanks before it.
    private struct Field {
        var name: Range<Int>
        var value: Range<Int>
    }

    public init(bodyLimit: Int) {
        self.bodyLimit = bodyLimit
        // Room for a usual header block, so that it is not reallocated line by line (and small
        // enough for malloc's fast path).
        lines.reserveCapacity(512)
        fields.reserveCapacity(16)
    }

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
        clearHeaders()
        body = []
    }

    /// The headers as received, in order: names as written, values without the blanks before them.
    public var headers: [(String, String)] {
        if let decoded { return decoded }
        let headers = lines.withUnsafeBufferPointer { lines in
            fields.map { (Self.text(lines, $0.name), Self.text(lines, $0.value)) }
        }
        decoded = headers
        return headers
    }

    /// The last value of a header (case-insensitive name). Asked on failures only (a webhook's
    /// `Retry-After`).
    public func header(_ name: String) -> String? {
        let lower = name.lowercased()
        return headers.last(where: { $0.0.lowercased() == lower })?.1
    }

    private func clearHeaders() {
        guard !fields.isEmpty else { return }
        lines.removeAll(keepingCapacity: true)
        fields.removeAll(keepingCapacity: true)
        decoded = nil
    }

    /// One header line as libcurl hands it over (CRLF included), read as bytes: the status line
    /// of a response, one of its headers, or the empty line that ends its header block.
    private func receive(_ line: UnsafeRawBufferPointer) {
        let line = line.assumingMemoryBound(to: UInt8.self)
        var end = line.count
        while end > 0, line[end - 1] == UInt8(ascii: "\r") || line[end - 1] == UInt8(ascii: "\n") { end -= 1 }
        guard end > 0 else {
            // The end of a header block: an informational response is complete.
            if (100..<200).contains(status) {
                onInformational?(self)
                // No final response yet: a transfer that ends here has no status.
                status = 0
                clearHeaders()
            }
            return
        }
        let text = UnsafeBufferPointer(rebasing: line[..<end])
        if Self.isStatusLine(text) {
            status = Self.statusCode(text)
            clearHeaders()
            body = []
        } else if let colon = text.firstIndex(of: UInt8(ascii: ":")) {
            var start = colon + 1
            while start < end, text[start] == UInt8(ascii: " ") || text[start] == UInt8(ascii: "\t") { start += 1 }
            let offset = lines.count
            lines.append(contentsOf: text)
            fields.append(Field(name: offset..<offset + colon, value: offset + start..<offset + end))
            decoded = nil
        }
    }

    /// Whether a line starts with "HTTP/": a status line.
    private static func isStatusLine(_ text: UnsafeBufferPointer<UInt8>) -> Bool {
        let prefix: StaticString = "HTTP/"
        return text.count >= prefix.utf8CodeUnitCount
            && prefix.withUTF8Buffer { prefix in prefix.indices.allSatisfy { text[$0] == prefix[$0] } }
    }

    /// "HTTP/1.1 200 OK": three digits after the version and its spaces, else 0 (no status).
    private static func statusCode(_ text: UnsafeBufferPointer<UInt8>) -> Int {
        let end = text.count
        var index = text.firstIndex(of: UInt8(ascii: " ")) ?? end
        while index < end, text[index] == UInt8(ascii: " ") { index += 1 }
        var code = 0
        var digits = 0
        while index < end, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(text[index]), digits < 4 {
            code = code * 10 + Int(text[index] - UInt8(ascii: "0"))
            digits += 1
            index += 1
        }
        return digits != 3 || index < end && text[index] != UInt8(ascii: " ") ? 0 : code
    }

    private static func text(_ lines: UnsafeBufferPointer<UInt8>, _ range: Range<Int>) -> String {
        String(decoding: UnsafeBufferPointer(rebasing: lines[range]), as: UTF8.self)
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
