import JSONValue

/// Where a download task puts what it fetches (OpenAPI/backhaul.yaml).
public struct DownloadSpec: Sendable, Equatable {
    /// The absolute path the finished file is renamed to.
    public var destination: String
    /// Replace a file already at `destination` (otherwise the task fails rather than replace it).
    public var overwrite: Bool
    /// The SHA-256 the finished file must have, lower-case hex.
    public var expectedSHA256: String?

    public init(destination: String, overwrite: Bool = false, expectedSHA256: String? = nil) {
        self.destination = destination
        self.overwrite = overwrite
        self.expectedSHA256 = expectedSHA256
    }

    /// The file the body is written to until it is complete.
    public var partPath: String { Self.partPath(of: destination) }

    public static func partPath(of destination: String) -> String { destination + ".part" }

    public var json: JSON {
        [
            "destination": .string(destination), "overwrite": .bool(overwrite),
            "expected_sha256": expectedSHA256.map { .string($0) } ?? .null,
        ]
    }

    public init?(_ json: JSON?) {
        guard let json, let destination = json["destination"]?.stringValue else { return nil }
        self.init(
            destination: destination, overwrite: json["overwrite"]?.boolValue ?? false,
            expectedSHA256: json["expected_sha256"]?.stringValue)
    }
}

/// Where the body of a download's response goes, decided from its head.
public enum ResponseBodyTarget: Sendable, Equatable {
    /// Into the `.part` file from `offset` (0: the file is truncated first). `total` is the size of
    /// the whole representation when the server said it.
    case write(offset: Int64, total: Int64?)
    /// Nowhere: the response is an error, or the `.part` file no longer matches the server's
    /// representation and the next request starts over.
    case discard
}

/// A download as a pure state machine. Each request is a `GET`; after a drop, a pause or a crash
/// it asks for the rest with `Range: bytes=N-` and `If-Range` carrying the validator persisted
/// with the offset (a strong `ETag`, else `Last-Modified`). A `200` to that request, a changed
/// `ETag`, or a `Content-Range` that does not start at N means the representation changed (or
/// the server ignores ranges): the body is taken from the start instead. Without a validator
/// nothing can prove the bytes on disk still belong, so the download starts over.
///
/// The engine writes the body and tells the machine (`didWrite`), makes the written bytes
/// durable (fsync) and then says so (`didPersist`): the checkpoint's offset never runs ahead of
/// the data on disk.
public struct DownloadMachine: TransferStateMachine {
    private enum State: Equatable {
        case idle
        case sent(ranged: Bool)
        case receiving, discarding, restarting, done
    }
    private var state = State.idle
    private let url: String
    private let headers: [(String, String)]
    /// Bytes at the start of the `.part` file known to be durable and to belong to `validator`.
    public private(set) var durableOffset: Int64
    public private(set) var validator: String?
    public private(set) var total: Int64?
    /// Where the current response's body is written, and how much of it has been.
    private var writeStart: Int64 = 0
    private var written: Int64 = 0
    private var restarts = 0
    private var attemptOfOffset: Int

    /// Restarts from zero allowed in one attempt (a server that changes the file under every
    /// request would otherwise loop).
    public static let maxRestarts = 3

    public init(task: TaskRecord, headers: [(String, String)], checkpoint: TransferCheckpoint?) {
        url = task.request.url
        self.headers = headers.filter { !["range", "if-range"].contains($0.0.lowercased()) }
        durableOffset = checkpoint?.offset ?? 0
        validator = checkpoint?.validator
        // A size below zero is none that a server said: unknown.
        total = checkpoint?.total.flatMap { $0 >= 0 ? $0 : nil }
        attemptOfOffset = checkpoint?.attempt ?? 0
    }

    public mutating func start(now: Timestamp) -> TransferStep {
        written = 0
        restarts = 0
        return .send(request())
    }

    private mutating func request() -> PlannedRequest {
        var lines = headers
        let ranged = durableOffset > 0 && validator != nil
        if ranged, let validator {
            lines.append(("Range", "bytes=\(durableOffset)-"))
            lines.append(("If-Range", Self.validatorValue(validator)))
        } else {
            durableOffset = 0
        }
        state = .sent(ranged: ranged)
        return PlannedRequest(method: "GET", url: url, headers: lines, body: .empty)
    }

    /// Decides where the body goes once the final response head has arrived.
    public mutating func didReceiveHead(_ head: ResponseHead) -> ResponseBodyTarget {
        guard case .sent(let ranged) = state else { return .discard }
        written = 0
        switch head.status {
        case 206:
            guard let range = ContentRange(head.headers["content-range"]) else {
                state = .discarding
                return .discard
            }
            let expected = ranged ? durableOffset : 0
            let sameRepresentation = !ranged || Self.sameValidator(validator, head)
            guard range.first == expected, sameRepresentation else {
                state = .restarting
                return .discard
            }
            if !ranged { validator = Self.validator(of: head) }
            total = range.total ?? total
            writeStart = expected
        case 200..<300:
            // The whole representation, from the start: a fresh download, or a ranged request the
            // server answered in full (it ignores ranges, or If-Range found a changed file).
            validator = Self.validator(of: head)
            total = head.headers["content-length"].flatMap { Int64($0) }.flatMap { $0 >= 0 ? $0 : nil }
            durableOffset = 0
            writeStart = 0
        case 416 where ranged:
            // Nothing after the offset: complete if the server's size says so, else start over.
            if let size = ContentRange(head.headers["content-range"])?.total, size == durableOffset,
                Self.sameValidator(validator, head)
            {
                total = size
                state = .done
            } else {
                state = .restarting
            }
            return .discard
        default:
            state = .discarding
            return .discard
        }
        state = .receiving
        return .write(offset: writeStart, total: total)
    }

    /// The engine wrote `count` more bytes of the body.
    public mutating func didWrite(_ count: Int64) { written += count }

    /// The engine made the file durable up to `offset` (in attempt `attempt`).
    public mutating func didPersist(offset: Int64, attempt: Int) {
        guard state == .receiving || state == .done, offset >= writeStart else { return }
        if offset > durableOffset { attemptOfOffset = attempt }
        durableOffset = offset
    }

    public mutating func didReceive(_ response: ResponseHead, now: Timestamp) -> TransferStep {
        switch state {
        case .receiving:
            let end = writeStart + written
            if let total, end != total {
                state = .idle
                return .failed(.transport(.connectionLost, message: "the body ended at byte \(end) of \(total)"))
            }
            total = end
            state = .done
            return .completed
        case .done:
            return .completed
        case .restarting:
            restarts += 1
            guard restarts <= Self.maxRestarts else {
                return .protocolViolation("the file changed at the server \(restarts) times during one attempt")
            }
            durableOffset = 0
            validator = nil
            total = nil
            return .send(request())
        case .discarding:
            state = .idle
            if (200..<300).contains(response.status) {
                return .protocolViolation("a 206 response without a usable Content-Range")
            }
            return .failed(response, now: now)
        case .idle, .sent:
            return .protocolViolation("unexpected response")
        }
    }

    /// Bytes of the file received so far (what progress shows).
    public var bytesAcknowledged: Int64 { state == .receiving || state == .done ? writeStart + written : max(0, durableOffset) }

    public var checkpoint: TransferCheckpoint? {
        var checkpoint = TransferCheckpoint(offset: durableOffset, attempt: attemptOfOffset)
        checkpoint.validator = validator
        checkpoint.total = total
        return checkpoint
    }

    // MARK: Validators

    /// A strong `ETag` (`etag:` prefix) or else `Last-Modified` (`date:`); weak ETags cannot be
    /// used with `If-Range` (RFC 9110 §13.1.5).
    static func validator(of head: ResponseHead) -> String? {
        if let tag = head.headers["etag"], !tag.hasPrefix("W/"), !tag.isEmpty { return "etag:" + tag }
        if let date = head.headers["last-modified"], !date.isEmpty { return "date:" + date }
        return nil
    }

    static func validatorValue(_ validator: String) -> String {
        String(validator.drop(while: { $0 != ":" }).dropFirst())
    }

    /// A ranged response belongs to the representation the offset was saved for: its `ETag` (or
    /// `Last-Modified`), when it sends one, is the one persisted.
    static func sameValidator(_ validator: String?, _ head: ResponseHead) -> Bool {
        guard let validator else { return false }
        if validator.hasPrefix("etag:") {
            return head.headers["etag"].map { "etag:" + $0 == validator } ?? true
        }
        return head.headers["last-modified"].map { "date:" + $0 == validator } ?? true
    }
}

/// `Content-Range: bytes first-last/total` (or `bytes */total` on a 416).
struct ContentRange: Equatable {
    var first: Int64?
    var last: Int64?
    var total: Int64?

    init?(_ text: String?) {
        guard let text, text.hasPrefix("bytes ") else { return nil }
        let spec = text.dropFirst(6).split(separator: "/", maxSplits: 1)
        guard spec.count == 2 else { return nil }
        total = spec[1] == "*" ? nil : Int64(spec[1].trimmed())
        if spec[1] != "*", (total ?? -1) < 0 { return nil }
        if spec[0] == "*" { return }
        let bounds = spec[0].split(separator: "-", maxSplits: 1)
        guard bounds.count == 2, let first = Int64(bounds[0].trimmed()), let last = Int64(bounds[1].trimmed()),
            first >= 0, last >= first
        else { return nil }
        self.first = first
        self.last = last
    }
}
