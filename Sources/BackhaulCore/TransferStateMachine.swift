/// A request an upload protocol wants sent; the engine performs it.
public struct PlannedRequest: Sendable, Equatable {
    public var method: String
    public var url: String
    public var headers: [(String, String)]
    public var body: PlannedBody
    /// Sign with AWS SigV4 (S3).
    public var signing: S3Credentials?
    /// Header names sent as trailers carrying the SHA-256 of the body, computed while it is read
    /// (RFC 9530 `sha-256=:…:`); the body then goes with chunked transfer encoding.
    public var digestTrailers: [String] = []
    /// A header carrying the SHA-256 of the file body, for protocols that want it before the
    /// body (tus `Upload-Checksum`, S3 `x-amz-checksum-sha256`): the engine reads the range once
    /// to hash it, in slices between transfers, before it sends the request.
    public var digestHeader: DigestHeader?

    public init(method: String, url: String, headers: [(String, String)], body: PlannedBody, signing: S3Credentials? = nil) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.signing = signing
    }

    public static func == (lhs: PlannedRequest, rhs: PlannedRequest) -> Bool {
        lhs.method == rhs.method && lhs.url == rhs.url && lhs.body == rhs.body && lhs.signing == rhs.signing
            && lhs.digestTrailers == rhs.digestTrailers && lhs.digestHeader == rhs.digestHeader
            && lhs.headers.map { "\($0.0): \($0.1)" } == rhs.headers.map { "\($0.0): \($0.1)" }
    }
}

/// A header whose value is `prefix` + the base64 SHA-256 of the request's file body (or of
/// `hashedRange` of the file) + `suffix`.
public struct DigestHeader: Sendable, Equatable {
    public var name: String
    public var prefix: String
    public var suffix: String
    /// The bytes of the file hashed, when not the body's (an IETF `Repr-Digest` covers the whole
    /// file while a `PATCH` carries its end).
    public var hashedRange: Range<Int64>?
    public init(name: String, prefix: String = "", suffix: String = "", hashedRange: Range<Int64>? = nil) {
        self.name = name
        self.prefix = prefix
        self.suffix = suffix
        self.hashedRange = hashedRange
    }
}

/// Where a request body comes from. File bodies are streamed from the open file, never copied.
public enum PlannedBody: Sendable, Equatable {
    case empty
    case file(offset: Int64, length: Int64)
    case multipart(MultipartPlan)
    /// A small body built by the protocol (an S3 CompleteMultipartUpload document).
    case bytes([UInt8])
}

public struct MultipartPlan: Sendable, Equatable {
    public var fields: [FormField]
    public var fileField: String
    public var filename: String
    public var contentType: String
    public var fileLength: Int64
    /// A text field sent after the file whose value is the file's SHA-256 in lower-case hex,
    /// computed while the file part is read.
    public var digestField: String?
}

extension MultipartPlan {
    /// The name of the trailing field that carries the file's SHA-256.
    public static let digestFieldName = "sha256"
}

public struct FormField: Sendable, Equatable {
    public var name: String
    public var value: String
    public init(name: String, value: String) {
        self.name = name
        self.value = value
    }
}

/// The head of a response, as protocols see it.
public struct ResponseHead: Sendable, Equatable {
    public var status: Int
    /// Lower-cased names.
    public var headers: [String: String]
    /// The first 64 KiB of the body (S3 answers in XML).
    public var body: [UInt8]

    public init(status: Int, headers: [String: String] = [:], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A head from the headers as received (names in any case, in order): the last value of each
    /// name is kept.
    public init(status: Int, received: [(String, String)], body: [UInt8] = []) {
        var headers = [String: String](minimumCapacity: received.count)
        for (name, value) in received { headers[name.asciiLowercased] = value }
        self.init(status: status, headers: headers, body: body)
    }
}

/// What an upload protocol wants next.
public enum TransferStep: Sendable, Equatable {
    case send(PlannedRequest)
    /// Every byte is acknowledged; the last response is the task's response.
    case completed
    case failed(AttemptFailure)
}

extension TransferStep {
    /// A response that ends the attempt: the status (and `Retry-After`) go to the retry policy,
    /// to be read with the protocol's table of transient answers (S3's with its error code).
    public static func failed(_ response: ResponseHead, now: Timestamp, answers: TransientAnswers = .http) -> TransferStep {
        if CredentialExpiry.says(response) { return .failed(.credentialsExpired(status: response.status)) }
        let retryAfter = response.headers["retry-after"].flatMap { RetryAfter.parse($0, now: now) }
        let code = answers == .s3 && !response.body.isEmpty ? XMLText.first("Code", in: response.body) : nil
        return .failed(.http(status: response.status, retryAfter: retryAfter, answers: answers, code: code))
    }

    /// The server refused the body because its checksum did not match: send it again.
    public static func checksumMismatch(_ response: ResponseHead) -> TransferStep {
        .failed(.checksumMismatch(status: response.status))
    }

    /// The server broke the protocol: no retry will help.
    public static func protocolViolation(_ message: String) -> TransferStep {
        .failed(.fatal(TaskError(.badServerResponse, message: message)))
    }

    /// The machine is in a state its own rules cannot reach (what it needs was never stored, or
    /// was stored broken): the task fails with `-3100 internal_error` and no retry, since the same
    /// state would come back, and the daemon goes on with its other tasks (docs/operations.md).
    public static func impossible(_ message: String) -> TransferStep {
        .failed(.fatal(TaskError(.internalError, message: message)))
    }
}

/// One upload protocol as a pure state machine: no I/O, no clock, no randomness.
/// The engine calls `start` at each attempt, then `didReceive` for each response.
public protocol TransferStateMachine: Sendable {
    mutating func start(now: Timestamp) -> TransferStep
    mutating func didReceive(_ response: ResponseHead, now: Timestamp) -> TransferStep
    /// An informational (1xx) response to the request in flight, handed over as soon as its head
    /// arrived while the request body may still be streaming (an IETF `104` naming the upload
    /// resource). True when `checkpoint` changed: the engine persists it at once.
    mutating func didReceiveInformational(_ response: ResponseHead) -> Bool
    /// Bytes the server has acknowledged (what survives a failure).
    var bytesAcknowledged: Int64 { get }
    /// What a resumable protocol persists as it goes (nil: the protocol starts over each attempt).
    var checkpoint: TransferCheckpoint? { get }
    /// What releases the server's side when the task is cancelled (tus termination, S3 abort).
    var cancellation: CleanupPlan? { get }
}

extension TransferStateMachine {
    public mutating func didReceiveInformational(_ response: ResponseHead) -> Bool { false }
    public var checkpoint: TransferCheckpoint? { nil }
    public var cancellation: CleanupPlan? { nil }
}

/// Makes the state machine for a task's protocol.
public enum TransferMachines {
    /// `cachedSelection`: for `auto`, what an `OPTIONS` to the same host found lately (the engine
    /// keeps it); a task that picked before keeps its own pick (its checkpoint).
    public static func machine(
        for task: TaskRecord, headers: [(String, String)],
        cachedSelection: ProtocolSelection.Choice? = nil
    ) -> any TransferStateMachine {
        if task.kind == .download { return DownloadMachine(task: task, headers: headers, checkpoint: task.checkpoint) }
        // Sizes come from `fstat` and the API never stores a negative one: a stored row that says
        // otherwise was damaged, and no protocol may plan a body from it.
        if task.file.size < 0 { return ImpossibleUpload(reason: "the stored task has the negative file size \(task.file.size)") }
        switch task.upload.protocolName {
        case .ietf:
            return IETFUpload(task: task, headers: headers, checkpoint: task.checkpoint)
        case .auto:
            return AutoUpload(task: task, headers: headers, checkpoint: task.checkpoint, cachedSelection: cachedSelection)
        case .chunked:
            return ChunkedUpload(task: task, headers: headers, checkpoint: task.checkpoint)
        case .tus:
            return TusUpload(task: task, headers: headers, checkpoint: task.checkpoint)
        case .s3:
            return S3Upload(task: task, headers: headers, checkpoint: task.checkpoint)
        case .raw, .multipart:
            return SingleRequestUpload(task: task, headers: headers)
        }
    }
}

/// An upload whose stored task no protocol can start from: every attempt fails `-3100
/// internal_error` with `reason` (`TransferStep.impossible`), and nothing is sent.
struct ImpossibleUpload: TransferStateMachine {
    let reason: String
    var bytesAcknowledged: Int64 { 0 }
    var checkpoint: TransferCheckpoint? { nil }
    var cancellation: CleanupPlan? { nil }
    mutating func start(now: Timestamp) -> TransferStep { .impossible(reason) }
    mutating func didReceive(_ response: ResponseHead, now: Timestamp) -> TransferStep { .impossible(reason) }
}
