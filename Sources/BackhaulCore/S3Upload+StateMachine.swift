import JSONValue

/// Credentials for SigV4 signing (OpenAPI/backhaul.yaml `s3`). The secret and the session token are stored
/// to sign with and never shown.
public struct S3Credentials: Sendable, Equatable {
    public var region: String
    public var accessKeyID: String
    public var secretAccessKey: String
    public var sessionToken: String?

    public init(region: String, accessKeyID: String, secretAccessKey: String, sessionToken: String? = nil) {
        self.region = region
        self.accessKeyID = accessKeyID
        self.secretAccessKey = secretAccessKey
        self.sessionToken = sessionToken
    }

    /// Credentials the daemon takes from the AWS chain (docs/credentials.md) when it signs: the task gave a
    /// region only.
    public static func fromChain(region: String) -> S3Credentials {
        S3Credentials(region: region, accessKeyID: "", secretAccessKey: "")
    }

    /// Whether the keys come from the daemon's AWS credential chain rather than the task.
    public var isFromChain: Bool { accessKeyID.isEmpty }

    /// These credentials with the chain's keys, for one request.
    public func resolved(with keys: AWSCredentials) -> S3Credentials {
        S3Credentials(
            region: region, accessKeyID: keys.accessKeyID, secretAccessKey: keys.secretAccessKey, sessionToken: keys.sessionToken)
    }

    public func json(redacted: Bool) -> JSON {
        var object: JSONObject = ["region": .string(region), "access_key_id": .string(accessKeyID)]
        if !redacted {
            object["secret_access_key"] = .string(secretAccessKey)
            if let sessionToken { object["session_token"] = .string(sessionToken) }
        }
        return .object(object)
    }

    static func decode(_ reader: FieldReader) throws(ValidationError) -> S3Credentials {
        try reader.rejectUnknown(["region", "access_key_id", "secret_access_key", "session_token"])
        let region = try reader.requiredString("region", maxLength: 64)
        guard !region.isEmpty, region.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" }) else {
            throw ValidationError(reader.field("region"), "is not an AWS region name")
        }
        guard reader.has("access_key_id") || reader.has("secret_access_key") || reader.has("session_token") else {
            // No keys: the daemon's AWS credential chain signs (environment, shared files,
            // container endpoint, IMDS).
            return .fromChain(region: region)
        }
        let key = try reader.requiredString("access_key_id", maxLength: 256)
        guard !key.isEmpty, !key.contains(":") else {
            throw ValidationError(reader.field("access_key_id"), "must be non-empty and must not contain ':'")
        }
        return S3Credentials(
            region: region, accessKeyID: key,
            secretAccessKey: try reader.requiredString("secret_access_key", maxLength: 1024),
            sessionToken: try reader.string("session_token", maxLength: 4096))
    }
}

/// S3 multipart upload (Create, UploadPart, Complete, Abort) signed with SigV4; `request.url`
/// is the object URL. A file of at most one part goes as one PUT. Each part's ETag is persisted;
/// on resume `ListParts` says which parts the server really holds, and parts after the first gap
/// are sent again. Cancelling aborts the multipart upload.
///
/// With `checksum: sha256` every part (and a single PUT) carries `x-amz-checksum-sha256`, the
/// upload is created with `x-amz-checksum-algorithm: SHA256`, Complete lists each part's
/// checksum, and a `BadDigest` answer sends the part again.
public struct S3Upload: TransferStateMachine {
    public static let minimumPartSize: Int64 = 5 << 20
    /// S3's largest part (and the largest `chunk_size` the API takes).
    public static let maximumPartSize: Int64 = 5 << 30
    public static let maximumParts: Int64 = 10_000

    /// The part size for a requested `chunk_size` (default 8 MiB, at least 5 MiB, at most 5 GiB).
    public static func partSize(_ requested: Int64?) -> Int64 {
        min(maximumPartSize, max(minimumPartSize, requested ?? ChunkedUpload.defaultChunkSize))
    }

    private enum State: Equatable {
        case idle, single, creating, listing
        case part(Int)
        case completing, done
    }

    private var state = State.idle
    private let url: String
    private let headers: [(String, String)]
    private let credentials: S3Credentials?
    private let total: Int64
    private let partSize: Int64
    private let contentType: String?
    public private(set) var uploadID: String?
    public private(set) var etags: [String]
    /// Each uploaded part's SHA-256 as the server echoed it, parallel to `etags`.
    public private(set) var checksums: [String]
    private let checksum: Bool
    /// Whether an attempt began: only then can there be an upload whose id was never learned.
    private let ran: Bool
    /// What makes the stored checkpoint one this protocol cannot have written (nil: none).
    private let brokenCheckpoint: String?

    public init(task: TaskRecord, headers: [(String, String)], checkpoint: TransferCheckpoint?) {
        url = task.request.url
        ran = task.startedAt != nil
        credentials = task.upload.s3
        var signed = headers
        signed.append(("x-amz-content-sha256", "UNSIGNED-PAYLOAD"))
        // A chain's session token is added by the engine, with the keys it signs with.
        if let token = task.upload.s3?.sessionToken { signed.append(("x-amz-security-token", token)) }
        self.headers = signed
        total = task.file.size
        partSize = Self.partSize(task.upload.chunkSize)
        contentType = task.upload.contentType
        checksum = task.upload.checksum == .sha256
        uploadID = checkpoint?.location
        etags = checkpoint?.location == nil ? [] : (checkpoint?.parts ?? [])
        checksums = checkpoint?.location == nil ? [] : (checkpoint?.partChecksums ?? [])
        checksums = Array((checksums + Array(repeating: "", count: etags.count)).prefix(etags.count))
        brokenCheckpoint = checkpoint.flatMap(Self.brokenCheckpoint)
    }

    /// Parts are stored only under the UploadId that holds them.
    static func brokenCheckpoint(_ checkpoint: TransferCheckpoint) -> String? {
        guard checkpoint.location == nil, !checkpoint.parts.isEmpty else { return nil }
        return "the stored checkpoint lists \(checkpoint.parts.count) uploaded parts but no multipart UploadId"
    }

    /// The header each body carries when checksums are on.
    private var digestHeader: DigestHeader? { checksum ? DigestHeader(name: "x-amz-checksum-sha256") : nil }

    private var partCount: Int64 { max(1, (total + partSize - 1) / partSize) }

    public var bytesAcknowledged: Int64 {
        state == .done ? total : min(total, Int64(etags.count) * partSize)
    }

    public var checkpoint: TransferCheckpoint? {
        TransferCheckpoint(offset: bytesAcknowledged, location: uploadID, parts: etags, partChecksums: checksum ? checksums : [])
    }

    /// The abort of the multipart upload. When its id is not known but an attempt may have
    /// created one (the cancel came while `CreateMultipartUpload` was in flight, or a crash came
    /// before its answer was saved), the key's uploads are listed and those no unfinished task
    /// holds are aborted (another program's upload of the very same key would be too). A single
    /// PUT leaves nothing to release.
    public var cancellation: CleanupPlan? {
        if let uploadID {
            return CleanupPlan(request: request("DELETE", query: "uploadId=\(Self.escape(uploadID))", body: .empty))
        }
        guard ran, total > partSize, let listing = Self.listingURL(objectURL: url) else { return nil }
        // The prefix stops before the first character that needs escaping: libcurl 7.88's SigV4
        // signs an escaped query value differently from S3 (403). The answers are filtered by the
        // exact key anyway.
        let prefix = listing.key.prefix { $0.isASCII && ($0.isLetter || $0.isNumber || "-_.~".contains($0)) }
        let list = PlannedRequest(
            method: "GET", url: listing.url + (prefix.isEmpty ? "?uploads=" : "?prefix=\(prefix)&uploads="),
            headers: headers, body: .empty, signing: credentials)
        return CleanupPlan(request: list, abortListedUploads: listing.key)
    }

    /// The bucket URL of an object URL and the object's key: virtual-hosted style
    /// (`https://bucket.s3.region.amazonaws.com/key`) when the host names S3 after its first
    /// label, else path style (`http://host:port/bucket/key`).
    static func listingURL(objectURL: String) -> (url: String, key: String)? {
        guard let parts = URLParts(objectURL) else { return nil }
        let afterScheme = objectURL.dropFirst(parts.scheme.count + 3)
        guard let slash = afterScheme.firstIndex(of: "/") else { return nil }
        let authority = String(afterScheme[..<slash])
        var path = Substring(afterScheme[afterScheme.index(after: slash)...])
        if let query = path.firstIndex(where: { $0 == "?" || $0 == "#" }) { path = path[..<query] }
        let base = "\(parts.scheme)://\(authority)"
        let labels = parts.host.split(separator: ".")
        if labels.count > 2, labels[1] == "s3" || labels[1].hasPrefix("s3-") {
            return path.isEmpty ? nil : (base + "/", Self.unescape(String(path)))
        }
        guard let bucketEnd = path.firstIndex(of: "/"), path.index(after: bucketEnd) < path.endIndex else { return nil }
        return (base + "/" + path[..<bucketEnd], Self.unescape(String(path[path.index(after: bucketEnd)...])))
    }

    /// The object URL again from a listing URL and a key (the inverse of `listingURL`).
    static func objectURL(fromListing listing: String, key: String) -> String {
        let bucket = listing.split(separator: "?", maxSplits: 1).first.map(String.init) ?? listing
        let escaped = key.split(separator: "/", omittingEmptySubsequences: false).map { escape(String($0)) }.joined(
            separator: "/")
        return (bucket.hasSuffix("/") ? bucket : bucket + "/") + escaped
    }

    /// Undoes percent-encoding in a URL path.
    static func unescape(_ text: String) -> String {
        var bytes: [UInt8] = []
        var iterator = Array(text.utf8).makeIterator()
        while let byte = iterator.next() {
            if byte == 37, let high = iterator.next(), let low = iterator.next(),
                let value = UInt8(String(decoding: [high, low], as: UTF8.self), radix: 16)
            {
                bytes.append(value)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    public mutating func start(now: Timestamp) -> TransferStep {
        if let brokenCheckpoint { return impossible(brokenCheckpoint) }
        guard partCount <= Self.maximumParts else {
            return .failed(
                .fatal(
                    TaskError(
                        .dataLengthExceedsMaximum,
                        message: "\(partCount) parts of \(partSize) bytes: S3 allows at most 10,000; raise chunk_size")))
        }
        if total <= partSize {
            state = .single
            var typed = request("PUT", query: nil, body: .file(offset: 0, length: total))
            if let contentType { typed.headers.append(("Content-Type", contentType)) }
            typed.digestHeader = digestHeader
            return .send(typed)
        }
        if let uploadID {
            state = .listing
            return .send(request("GET", query: "uploadId=\(Self.escape(uploadID))", body: .empty))
        }
        return create()
    }

    public mutating func didReceive(_ response: ResponseHead, now: Timestamp) -> TransferStep {
        let status = response.status
        let ok = (200..<300).contains(status)
        switch state {
        case .single:
            if isBadDigest(response) { return failHTTP(response, now: now) }
            guard ok else { return failHTTP(response, now: now) }
            state = .done
            return .completed
        case .creating:
            guard ok, let id = XMLText.first("UploadId", in: response.body) else { return failHTTP(response, now: now) }
            uploadID = id
            etags = []
            checksums = []
            return nextPart()
        case .listing:
            if status == 404 {
                // The multipart upload is gone (aborted or expired): start again.
                uploadID = nil
                etags = []
                checksums = []
                return create()
            }
            guard ok else { return failHTTP(response, now: now) }
            let parts = Self.contiguousParts(XMLText.blocks("Part", in: response.body), partSize: partSize)
            etags = parts.map(\.etag)
            checksums = parts.map(\.checksum)
            return nextPart()
        case .part(let number):
            guard ok, let etag = response.headers["etag"] else { return failHTTP(response, now: now) }
            etags = Array(etags.prefix(number - 1)) + [etag]
            checksums = Array(checksums.prefix(number - 1)) + [response.headers["x-amz-checksum-sha256"] ?? ""]
            return nextPart()
        case .completing:
            // S3 can answer 200 with an <Error> document when completion fails late.
            // The SDKs read it as the 500 it stands for.
            if ok, let code = XMLText.first("Code", in: response.body) {
                return .failed(.http(status: 500, retryAfter: nil, answers: .s3, code: code))
            }
            guard ok else {
                return failHTTP(response, now: now)
            }
            state = .done
            return .completed
        case .idle, .done:
            return .protocolViolation("a response came when none was expected")
        }
    }

    private mutating func create() -> TransferStep {
        state = .creating
        var created = request("POST", query: "uploads=", body: .file(offset: 0, length: 0))
        if let contentType { created.headers.append(("Content-Type", contentType)) }
        if checksum { created.headers.append(("x-amz-checksum-algorithm", "SHA256")) }
        return .send(created)
    }

    private mutating func nextPart() -> TransferStep {
        guard let uploadID else { return impossible("a part is due but no multipart UploadId is known") }
        let number = etags.count + 1
        let first = Int64(number - 1) * partSize
        guard first < total else { return complete() }
        state = .part(number)
        let length = min(partSize, total - first)
        // Query keys already in sorted order, as SigV4 with libcurl 7.88 wants.
        var part = request(
            "PUT", query: "partNumber=\(number)&uploadId=\(Self.escape(uploadID))",
            body: .file(offset: first, length: length))
        part.digestHeader = digestHeader
        return .send(part)
    }

    private mutating func complete() -> TransferStep {
        guard let uploadID else { return impossible("the completion is due but no multipart UploadId is known") }
        state = .completing
        var document = "<CompleteMultipartUpload>"
        for (index, etag) in etags.enumerated() {
            let sum =
                index < checksums.count && !checksums[index].isEmpty
                ? "<ChecksumSHA256>\(XMLText.escape(checksums[index]))</ChecksumSHA256>" : ""
            document += "<Part><PartNumber>\(index + 1)</PartNumber><ETag>\(XMLText.escape(etag))</ETag>\(sum)</Part>"
        }
        document += "</CompleteMultipartUpload>"
        var request = request("POST", query: "uploadId=\(Self.escape(uploadID))", body: .bytes(Array(document.utf8)))
        request.headers.append(("Content-Type", "application/xml"))
        return .send(request)
    }

    private func request(_ method: String, query: String?, body: PlannedBody) -> PlannedRequest {
        PlannedRequest(
            method: method, url: query.map { url + "?" + $0 } ?? url, headers: headers, body: body, signing: credentials)
    }

    private mutating func impossible(_ message: String) -> TransferStep {
        state = .idle
        return .impossible(message)
    }

    /// Ends the attempt on an error answer; a checksum mismatch sends the piece again.
    private mutating func failHTTP(_ response: ResponseHead, now: Timestamp) -> TransferStep {
        state = .idle
        return isBadDigest(response) ? .checksumMismatch(response) : .failed(response, now: now, answers: .s3)
    }

    /// S3's answer when the body does not match the checksum sent with it.
    private func isBadDigest(_ response: ResponseHead) -> Bool {
        guard checksum, response.status == 400, let code = XMLText.first("Code", in: response.body) else { return false }
        return code == "BadDigest" || code == "XAmzContentChecksumMismatch"
    }

    /// The parts 1…n that the server holds whole, up to the first gap.
    static func contiguousParts(_ parts: [String], partSize: Int64) -> [(etag: String, checksum: String)] {
        var byNumber: [Int: (etag: String, checksum: String, size: Int64)] = [:]
        for part in parts {
            let bytes = Array(part.utf8)
            guard let number = XMLText.first("PartNumber", in: bytes).flatMap({ Int($0) }),
                let etag = XMLText.first("ETag", in: bytes)
            else { continue }
            byNumber[number] = (
                etag, XMLText.first("ChecksumSHA256", in: bytes) ?? "",
                XMLText.first("Size", in: bytes).flatMap { Int64($0) } ?? partSize
            )
        }
        var result: [(etag: String, checksum: String)] = []
        while let part = byNumber[result.count + 1], part.size == partSize {
            result.append((part.etag, part.checksum))
        }
        return result
    }

    /// Percent-encodes an UploadId for a query string.
    static func escape(_ text: String) -> String {
        var result = ""
        for byte in text.utf8 {
            let character = Character(Unicode.Scalar(byte))
            if character.isLetter && byte < 128 || character.isNumber && byte < 128 || "-_.~".contains(character) {
                result.append(character)
            } else {
                let hex = String(byte, radix: 16, uppercase: true)
                result += "%" + (hex.count == 1 ? "0" + hex : hex)
            }
        }
        return result
    }
}
