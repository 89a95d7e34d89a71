/// One event of a `text/event-stream`.
public struct ServerSentEvent: Equatable, Sendable {
    public var id: String?
    public var type: String
    public var data: String

    public init(id: String? = nil, type: String = "message", data: String) {
        self.id = id
        self.type = type
        self.data = data
    }
}

/// Reads the server-sent events format (WHATWG HTML, "Server-sent events") from bytes as they
/// arrive, in pieces of any size: each `feed` returns the events its bytes completed.
public struct ServerSentEventParser {
    private var line: [UInt8] = []
    private var afterCarriageReturn = false
    private var id: String?
    private var type = ""
    private var data: [String] = []

    public init() {}

    public mutating func feed(_ bytes: some Sequence<UInt8>) -> [ServerSentEvent] {
        var events: [ServerSentEvent] = []
        for byte in bytes {
            // A line ends with CR, LF or CR LF.
            if byte == UInt8(ascii: "\n"), afterCarriageReturn {
                afterCarriageReturn = false
                continue
            }
            afterCarriageReturn = byte == UInt8(ascii: "\r")
            guard byte == UInt8(ascii: "\n") || byte == UInt8(ascii: "\r") else {
                line.append(byte)
                continue
            }
            if let event = endLine() { events.append(event) }
        }
        return events
    }

    /// Applies the line just ended; a blank line dispatches the event it completes.
    private mutating func endLine() -> ServerSentEvent? {
        defer { line.removeAll(keepingCapacity: true) }
        guard !line.isEmpty else {
            defer {
                type = ""
                data = []
            }
            guard !data.isEmpty else { return nil }
            return ServerSentEvent(id: id, type: type.isEmpty ? "message" : type, data: data.joined(separator: "\n"))
        }
        guard line.first != UInt8(ascii: ":") else { return nil }  // a comment (keep-alives)
        let colon = line.firstIndex(of: UInt8(ascii: ":")) ?? line.endIndex
        let field = String(decoding: line[..<colon], as: UTF8.self)
        var value = colon < line.endIndex ? line[(colon + 1)...] : []
        if value.first == UInt8(ascii: " ") { value = value.dropFirst() }
        let text = String(decoding: value, as: UTF8.self)
        switch field {
        case "data": data.append(text)
        case "event": type = text
        case "id" where !text.contains("\0"): id = text
        default: break  // "retry" and unknown fields
        }
        return nil
    }
}
