import JSONValue

/// A session's signer (docs/credentials.md): a server of the application's that the daemon asks,
/// just before a request, for the URL (and headers) to send it with. The secret signs what the
/// daemon sends it as a Standard Webhook; it is stored to sign with and shown once, in the answer
/// to the session's PUT or PATCH that set it.
///
/// A class, so that `TransferConfiguration`, which the engine copies several times for every task,
/// holds one reference for it rather than two strings: with the strings inline the configuration
/// grew past 128 bytes, and each copy became a call to `memcpy` (about 400 instructions a task in
/// all). Its fields do not change; two are equal when their URL and secret are.
public final class SignerConfiguration: Sendable, Equatable {
    public let url: String
    public let secret: String

    public init(url: String, secret: String) {
        self.url = url
        self.secret = secret
    }

    public static func == (lhs: SignerConfiguration, rhs: SignerConfiguration) -> Bool {
        lhs.url == rhs.url && lhs.secret == rhs.secret
    }

    /// The API's view (`redacted`: without the secret) or the stored form.
    public func json(redacted: Bool) -> JSON {
        var object: JSONObject = ["url": .string(url)]
        if !redacted { object["secret"] = .string(secret) }
        return .object(object)
    }

    /// `{"url", "secret"}`: an absolute http(s) URL, and a `whsec_` secret (the API fills it in
    /// when the client gives none).
    static func read(_ reader: FieldReader) throws(ValidationError) -> SignerConfiguration {
        try reader.rejectUnknown(["url", "secret"])
        let url = try reader.requiredString("url", maxLength: 4096)
        guard URLParts(url) != nil else { throw ValidationError(reader.field("url"), "must be an absolute http or https URL") }
        let secret = try reader.requiredString("secret", maxLength: 256)
        guard WebhookRecord.key(of: secret) != nil else {
            throw ValidationError(reader.field("secret"), "must be whsec_ followed by base64 of 16 to 128 bytes")
        }
        return SignerConfiguration(url: url, secret: secret)
    }
}

/// Which request of a task the signer is asked to sign (the `step` of its request).
public enum SignStep: String, Sendable, Equatable {
    /// The one request of a `raw` or `multipart` upload, or a download's.
    case request
    /// A resumable upload's creation (tus and IETF `POST`, `OPTIONS`, chunked's first `PUT`),
    /// S3's CreateMultipartUpload.
    case create
    /// A request that goes on with an upload made before (`HEAD`, `PATCH`, chunked's further
    /// `PUT`s and its offset query), S3's ListParts.
    case resume
    /// S3's UploadPart.
    case part
    /// S3's CompleteMultipartUpload.
    case complete
    /// A cleanup's release of the upload at the server (tus/IETF `DELETE`, S3's
    /// AbortMultipartUpload and the listing before it).
    case abort
}

/// A request's place in its task, as the signer is told it.
public struct SignTarget: Sendable, Equatable {
    public var step: SignStep
    public var partNumber: Int?
    public var uploadID: String?

    public init(step: SignStep, partNumber: Int? = nil, uploadID: String? = nil) {
        self.step = step
        self.partNumber = partNumber
        self.uploadID = uploadID
    }

    /// The step of `request`, sent by a task of `protocolName` (`kind` download: always
    /// `request`); `cleanup` for the requests that release an upload.
    public static func of(
        _ request: PlannedRequest, kind: TaskKind, protocolName: UploadProtocol, cleanup: Bool = false
    ) -> SignTarget {
        let query = Self.query(of: request.url)
        let uploadID = query["uploadId"]
        if cleanup { return SignTarget(step: .abort, uploadID: uploadID) }
        guard kind == .upload else { return SignTarget(step: .request) }
        switch protocolName {
        case .raw, .multipart:
            return SignTarget(step: .request)
        case .s3:
            if query["partNumber"] != nil {
                return SignTarget(step: .part, partNumber: query["partNumber"].flatMap { Int($0) }, uploadID: uploadID)
            }
            guard let uploadID else { return SignTarget(step: .create) }
            switch request.method {
            case "POST": return SignTarget(step: .complete, uploadID: uploadID)
            case "DELETE": return SignTarget(step: .abort, uploadID: uploadID)
            default: return SignTarget(step: .resume, uploadID: uploadID)
            }
        case .chunked:
            // The first piece (bytes 0-…) makes the upload; the offset query and later pieces go on with it.
            let range = request.headers.last { $0.0.asciiLowercased == "content-range" }?.1 ?? ""
            return SignTarget(step: range.hasPrefix("bytes 0-") ? .create : .resume)
        case .tus, .ietf, .auto:
            switch request.method {
            case "POST", "OPTIONS": return SignTarget(step: .create)
            case "DELETE": return SignTarget(step: .abort)
            default: return SignTarget(step: .resume)
            }
        }
    }

    /// The query's parameters, percent-decoded (the last of a repeated name wins; a name alone
    /// maps to "").
    static func query(of url: String) -> [String: String] {
        guard let mark = url.firstIndex(of: "?") else { return [:] }
        var result: [String: String] = [:]
        for pair in url[url.index(after: mark)...].split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let name = percentDecoded(parts[0])
            result[name] = parts.count > 1 ? percentDecoded(parts[1]) : ""
        }
        return result
    }

    /// `%XX` decoded (a malformed escape is kept as written).
    static func percentDecoded(_ text: Substring) -> String {
        let bytes = Array(text.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var index = 0
        while index < bytes.count {
            if bytes[index] == UInt8(ascii: "%"), index + 2 < bytes.count,
                let high = hexValue(bytes[index + 1]), let low = hexValue(bytes[index + 2])
            {
                out.append(high << 4 | low)
                index += 3
            } else {
                out.append(bytes[index])
                index += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case 48...57: return byte - 48
        case 65...70: return byte - 55
        case 97...102: return byte - 87
        default: return nil
        }
    }
}

/// What the signer answered for one request: where and how to send it, until when.
public struct Signature: Sendable, Equatable {
    public var url: String
    public var method: String?
    public var headers: [(String, String)]
    public var expiresAt: Timestamp?

    public init(url: String, method: String? = nil, headers: [(String, String)] = [], expiresAt: Timestamp? = nil) {
        self.url = url
        self.method = method
        self.headers = headers
        self.expiresAt = expiresAt
    }

    public static func == (lhs: Signature, rhs: Signature) -> Bool {
        lhs.url == rhs.url && lhs.method == rhs.method && lhs.expiresAt == rhs.expiresAt
            && lhs.headers.map { "\($0.0): \($0.1)" } == rhs.headers.map { "\($0.0): \($0.1)" }
    }

    /// How long before `expiresAt` a signature is no longer used: a request that starts then may
    /// still be sending when it expires.
    public static let renewalMargin: Double = 60

    /// Whether a request starting at `now` may still use it. A signature without `expires_at`
    /// serves the one request it was asked for only.
    public func usable(at now: Timestamp) -> Bool {
        guard let expiresAt else { return false }
        return expiresAt - now > Self.renewalMargin
    }

    /// `request` as the signer said to send it: its URL, its method when given, its headers with
    /// the signer's added (replacing those of the same name), and no SigV4 of the daemon's (the
    /// signer's URL carries the signature).
    public func applied(to request: PlannedRequest) -> PlannedRequest {
        var signed = request
        signed.url = url
        if let method { signed.method = method }
        for (name, value) in headers {
            signed.headers.removeAll { $0.0.asciiLowercased == name.asciiLowercased }
            signed.headers.append((name, value))
        }
        signed.signing = nil
        return signed
    }
}

/// The signer's answer, decided (docs/credentials.md): a signature; a transient failure, retried
/// with backoff (the signer down, a 5xx, a timeout, an answer that is not JSON); or the task's
/// end (a 4xx: `-1013 signer_refused`; a JSON answer without a usable `url`: `-1011
/// signer_invalid_answer`).
public enum SignerOutcome: Sendable, Equatable {
    case signed(Signature)
    case transient(String)
    case failed(TaskError)

    /// `status` 0: no answer (`transportError` says why). `json`: the body parsed, nil when it is
    /// not JSON. `now` turns a relative `expires_in` into `expires_at`.
    public static func decide(status: Int, json: JSON?, transportError: String? = nil) -> SignerOutcome {
        if status == 0 { return .transient("the signer could not be reached: \(transportError ?? "no answer")") }
        if (400..<500).contains(status) && status != 408 && status != 429 {
            return .failed(
                TaskError(
                    .userAuthenticationRequired, message: "the signer refused to sign the request (HTTP \(status))",
                    reason: .signerRefused))
        }
        guard status == 200 else { return .transient("the signer answered HTTP \(status)") }
        guard let object = json?.objectValue else { return .transient("the signer's answer is not a JSON object") }
        guard let url = object["url"]?.stringValue, URLParts(url) != nil else {
            return .failed(invalid("the signer's answer has no absolute http(s) url"))
        }
        var signature = Signature(url: url)
        if let method = object["method"], method != .null {
            guard let name = method.stringValue, (1...16).contains(name.utf8.count),
                name.utf8.allSatisfy({ (65...90).contains($0) || (97...122).contains($0) })
            else {
                return .failed(invalid("the signer's method is not an HTTP method"))
            }
            signature.method = name.uppercased()
        }
        if let headers = object["headers"], headers != .null {
            guard let members = headers.objectValue else { return .failed(invalid("the signer's headers are not an object")) }
            for (name, value) in members.sorted(by: { $0.key < $1.key }) {
                guard let text = value.stringValue, (try? HeaderRules.validate(name: name, value: text, field: "headers")) != nil
                else { return .failed(invalid("the signer's header \(name) cannot be sent")) }
                signature.headers.append((name, text))
            }
        }
        if let expires = object["expires_at"], expires != .null {
            guard let at = expires.stringValue.flatMap(RFC3339.parse) else {
                return .failed(invalid("the signer's expires_at is not an RFC 3339 time"))
            }
            signature.expiresAt = at
        }
        return .signed(signature)
    }

    private static func invalid(_ message: String) -> TaskError {
        TaskError(.badServerResponse, message: message, reason: .signerInvalidAnswer)
    }
}

/// The body the daemon POSTs to the signer (docs/credentials.md). The task's secret headers go
/// redacted: the signer signs where the request goes, it is not given the task's credentials.
public enum SignRequest {
    public static func body(task: TaskRecord, target: SignTarget, request: PlannedRequest) -> JSON {
        var metadata: JSONObject = [:]
        metadata["description"] = task.description.map { .string($0) } ?? .null
        metadata["filename"] = task.upload.filename.map { .string($0) } ?? .null
        metadata["content_type"] = task.upload.contentType.map { .string($0) } ?? .null
        let taskObject: JSONObject = [
            "id": .string(task.id), "session": .string(task.sessionID), "file": .string(task.file.path),
            "size": .int(task.file.size), "metadata": .object(metadata),
        ]
        var object: JSONObject = [
            "type": "sign", "task": .object(taskObject), "step": .string(target.step.rawValue),
            "request": [
                "method": .string(request.method), "url": .string(request.url),
                "headers": HeaderRules.json(request.headers, redacted: true),
            ],
        ]
        if let part = target.partNumber { object["part_number"] = .int(Int64(part)) }
        if let upload = target.uploadID { object["upload_id"] = .string(upload) }
        return .object(object)
    }
}
