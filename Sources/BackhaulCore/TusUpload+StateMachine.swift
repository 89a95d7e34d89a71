/// tus 1.0.0 (core, creation, termination). `request.url` is the creation endpoint.
///
/// - No upload yet: `POST` with `Upload-Length` and `Upload-Metadata` (filename, filetype);
///   the `Location` answered is the upload's URL, persisted at once.
/// - Then `PATCH`es of `chunk_size` bytes with `Upload-Offset`; each answer's `Upload-Offset`
///   is the acknowledged offset, persisted.
/// - Resuming (a known URL): `HEAD` learns the server's offset. A `409` offset mismatch re-syncs
///   with `HEAD` instead of failing; a `404`/`410` (the upload expired) starts a new one.
/// - Cancelling sends `DELETE` to the upload URL (termination).
/// - With `checksum: sha256`, each attempt first asks with `OPTIONS` whether the server offers the
///   checksum extension with sha256; if it does, each `PATCH` carries `Upload-Checksum: sha256
///   <base64>` and a `460 Checksum Mismatch` sends that chunk again. A server without it gets
///   plain PATCHes.
public struct TusUpload: TransferStateMachine {
    public static let version = "1.0.0"

    private enum State: Equatable {
        case idle, discovering, creating, probing
        case patching(first: Int64, last: Int64)
        case done
    }

    /// The status a tus server answers when `Upload-Checksum` does not match the body.
    public static let checksumMismatchStatus = 460

    private var state = State.idle
    private let creationURL: String
    private let headers: [(String, String)]
    private let total: Int64
    private let chunkSize: Int64
    private let metadata: String
    public private(set) var offset: Int64
    public private(set) var location: String?
    private let wantsChecksum: Bool
    /// Whether the server offers the checksum extension with sha256; nil until asked this attempt.
    public private(set) var checksumOffered: Bool?
    /// What makes the stored checkpoint one this protocol cannot have written (nil: none): every
    /// attempt then fails `internal_error` instead of guessing.
    private let brokenCheckpoint: String?

    public init(task: TaskRecord, headers: [(String, String)], checkpoint: TransferCheckpoint?) {
        creationURL = task.request.url
        self.headers = headers + [("Tus-Resumable", Self.version)]
        total = task.file.size
        chunkSize = ChunkedUpload.chunkSize(task.upload.chunkSize, total: task.file.size)
        let name = task.upload.filename ?? String(task.file.path.split(separator: "/").last ?? "file")
        let type = task.upload.contentType ?? "application/octet-stream"
        metadata = "filename \(Base64.encode(Array(name.utf8))),filetype \(Base64.encode(Array(type.utf8)))"
        wantsChecksum = task.upload.checksum == .sha256
        location = checkpoint?.location
        offset = checkpoint?.location == nil ? 0 : min(checkpoint?.offset ?? 0, task.file.size)
        brokenCheckpoint = checkpoint.flatMap(Self.brokenCheckpoint)
    }

    /// A tus checkpoint counts bytes only once the creation named the upload's URL, and never
    /// fewer than none.
    static func brokenCheckpoint(_ checkpoint: TransferCheckpoint) -> String? {
        if checkpoint.offset < 0 { return "the stored checkpoint has the negative offset \(checkpoint.offset)" }
        if checkpoint.offset > 0, checkpoint.location == nil {
            return "the stored checkpoint counts \(checkpoint.offset) acknowledged bytes but names no tus upload URL"
        }
        return nil
    }

    /// Never below zero, though a broken stored checkpoint may say so (`brokenCheckpoint`).
    public var bytesAcknowledged: Int64 { max(0, offset) }

    public var checkpoint: TransferCheckpoint? { TransferCheckpoint(offset: offset, location: location) }

    /// Termination of the upload. A cancel that comes while the creation is in flight cannot
    /// release what the server may create: tus has no way to find it again.
    public var cancellation: CleanupPlan? {
        location.map { CleanupPlan(request: PlannedRequest(method: "DELETE", url: $0, headers: headers, body: .empty)) }
    }

    public mutating func start(now: Timestamp) -> TransferStep {
        if let brokenCheckpoint { return impossible(brokenCheckpoint) }
        if wantsChecksum, checksumOffered == nil {
            state = .discovering
            return .send(PlannedRequest(method: "OPTIONS", url: creationURL, headers: headers, body: .empty))
        }
        return resume()
    }

    private mutating func resume() -> TransferStep {
        guard location != nil else { return create() }
        return probe()
    }

    private mutating func probe() -> TransferStep {
        guard let location else { return impossible("a HEAD is due but no tus upload URL is known") }
        state = .probing
        return .send(PlannedRequest(method: "HEAD", url: location, headers: headers, body: .empty))
    }

    public mutating func didReceive(_ response: ResponseHead, now: Timestamp) -> TransferStep {
        let status = response.status
        switch state {
        case .discovering:
            // A server that cannot answer OPTIONS is taken to offer no extension.
            func listed(_ name: String) -> [String] {
                (response.headers[name] ?? "").split(separator: ",").map { $0.trimmed().lowercased() }
            }
            checksumOffered =
                (200..<300).contains(status) && listed("tus-extension").contains("checksum")
                && listed("tus-checksum-algorithm").contains("sha256")
            return resume()
        case .creating:
            guard status == 201, let target = response.headers["location"] else { return failHTTP(response, now: now) }
            let given = response.headers["upload-offset"]
            guard let created = given.map(HeaderNumber.count) ?? 0, created <= total else {
                return fail("the server created the upload at offset \(given ?? "") of \(total)")
            }
            location = Self.resolve(target, against: creationURL)
            offset = created
            return next()
        case .probing:
            if status == 404 || status == 410 {
                // The server forgot the upload: start a new one.
                location = nil
                offset = 0
                return create()
            }
            guard (200..<300).contains(status) else { return failHTTP(response, now: now) }
            // An offset that is no count, or past the file, is a lie: no retry makes it true.
            guard let serverOffset = response.headers["upload-offset"].flatMap(HeaderNumber.count), serverOffset <= total else {
                return fail("the upload answered HEAD with the offset \(response.headers["upload-offset"] ?? "none") of \(total)")
            }
            offset = serverOffset
            return next()
        case .patching(_, let last):
            if status == 409 {
                // Offset mismatch: ask where the server is rather than fail.
                return probe()
            }
            if status == Self.checksumMismatchStatus, checksumOffered == true {
                state = .idle
                return .checksumMismatch(response)
            }
            guard (200..<300).contains(status) else { return failHTTP(response, now: now) }
            let given = response.headers["upload-offset"]
            guard let acknowledged = given.map(HeaderNumber.count) ?? (last + 1), acknowledged > offset, acknowledged <= total
            else {
                return fail("the server acknowledged offset \(given ?? "none") after a PATCH at \(offset)")
            }
            offset = acknowledged
            return next()
        case .idle, .done:
            return fail("a response came when none was expected")
        }
    }

    private mutating func create() -> TransferStep {
        state = .creating
        return .send(
            PlannedRequest(
                method: "POST", url: creationURL,
                headers: headers + [("Upload-Length", String(total)), ("Upload-Metadata", metadata)],
                body: .file(offset: 0, length: 0)))
    }

    private mutating func next() -> TransferStep {
        guard offset < total else {
            state = .done
            return .completed
        }
        guard let location else { return impossible("a PATCH is due but no tus upload URL is known") }
        let last = min(total, offset + chunkSize) - 1
        state = .patching(first: offset, last: last)
        var patch = PlannedRequest(
            method: "PATCH", url: location,
            headers: headers + [("Upload-Offset", String(offset)), ("Content-Type", "application/offset+octet-stream")],
            body: .file(offset: offset, length: last - offset + 1))
        if checksumOffered == true { patch.digestHeader = DigestHeader(name: "Upload-Checksum", prefix: "sha256 ") }
        return .send(patch)
    }

    private mutating func failHTTP(_ response: ResponseHead, now: Timestamp) -> TransferStep {
        state = .idle
        return .failed(response, now: now, answers: .tus)
    }

    private mutating func fail(_ message: String) -> TransferStep {
        state = .idle
        return .protocolViolation(message)
    }

    private mutating func impossible(_ message: String) -> TransferStep {
        state = .idle
        return .impossible(message)
    }

    /// An absolute `Location` as is; a path against the creation URL's origin.
    static func resolve(_ location: String, against base: String) -> String {
        if location.hasPrefix("http://") || location.hasPrefix("https://") { return location }
        guard location.hasPrefix("/"), let parts = URLParts(base) else { return location }
        let defaultPort = parts.scheme == "https" ? 443 : 80
        return "\(parts.scheme)://\(parts.host)\(parts.port == defaultPort ? "" : ":\(parts.port)")\(location)"
    }
}
