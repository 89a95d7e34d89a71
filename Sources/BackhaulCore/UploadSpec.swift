import JSONValue

/// The protocols an upload can speak (OpenAPI/backhaul.yaml `upload.protocol`).
public enum UploadProtocol: String, Sendable, CaseIterable {
    case raw, multipart, chunked, tus, s3
    /// draft-ietf-httpbis-resumable-upload (docs/decisions.md).
    case ietf
    /// One `OPTIONS` picks `ietf`, `tus` or `raw` (docs/decisions.md); see `ProtocolSelection`.
    case auto

    /// Protocols this build can carry out; the others are refused at enqueue.
    public static let supported: Set<UploadProtocol> = [.raw, .multipart, .chunked, .tus, .s3, .ietf, .auto]
}

/// How the file is sent (OpenAPI/backhaul.yaml `upload`).
public struct UploadSpec: Sendable, Equatable {
    public var protocolName: UploadProtocol = .raw
    public var field = "file"
    public var filename: String?
    public var contentType: String?
    public var fields: [(String, String)] = []
    public var chunkSize: Int64?
    /// S3 credentials (`s3` protocol); stored to sign with, never shown.
    public var s3: S3Credentials?
    /// A digest computed while the file is read and sent with it.
    public var checksum: ChecksumAlgorithm?
    /// `ietf` (and `auto` when it picks ietf): the interop version to speak; nil: the newest the
    /// server takes (see `IETFUpload`).
    public var interopVersion: Int?

    public enum ChecksumAlgorithm: String, Sendable { case sha256 }

    public init(protocolName: UploadProtocol = .raw) { self.protocolName = protocolName }

    /// Field by field, the chunk size as it takes effect (unset is the protocol's default).
    public static func == (lhs: UploadSpec, rhs: UploadSpec) -> Bool {
        lhs.protocolName == rhs.protocolName && lhs.field == rhs.field && lhs.filename == rhs.filename
            && lhs.contentType == rhs.contentType && lhs.fields.elementsEqual(rhs.fields, by: ==)
            && lhs.effectiveChunkSize == rhs.effectiveChunkSize && lhs.s3 == rhs.s3 && lhs.checksum == rhs.checksum
            && lhs.interopVersion == rhs.interopVersion
    }

    /// The chunk size the protocol uses (what `json` shows).
    var effectiveChunkSize: Int64? {
        switch protocolName {
        case .chunked, .tus: return chunkSize ?? ChunkedUpload.defaultChunkSize
        case .s3: return S3Upload.partSize(chunkSize)
        default: return chunkSize
        }
    }

    /// What the database keeps: the API's view plus the S3 secrets needed to sign.
    public var storedJSON: JSON {
        guard let s3, case .object(var object) = json else { return json }
        object["s3"] = s3.json(redacted: false)
        return .object(object)
    }

    /// The API's view: S3 secrets left out.
    public var json: JSON {
        var object: JSONObject = ["protocol": .string(protocolName.rawValue)]
        if protocolName == .multipart {
            object["field"] = .string(field)
            if let filename { object["filename"] = .string(filename) }
            if let contentType { object["content_type"] = .string(contentType) }
            var formFields = JSONObject()
            for (name, value) in fields { formFields[name] = .string(value) }
            object["fields"] = .object(formFields)
        } else {
            // tus (and auto, should it pick tus) sends `filename` in its Upload-Metadata.
            if let filename, protocolName == .tus || protocolName == .auto { object["filename"] = .string(filename) }
            if let contentType { object["content_type"] = .string(contentType) }
        }
        if let checksum { object["checksum"] = .string(checksum.rawValue) }
        if protocolName == .ietf || protocolName == .auto {
            object["interop_version"] = interopVersion.map { .int(Int64($0)) } ?? .null
        }
        if protocolName == .chunked || protocolName == .tus || protocolName == .auto {
            object["chunk_size"] = .int(chunkSize ?? ChunkedUpload.defaultChunkSize)
        } else if protocolName == .s3 {
            object["chunk_size"] = .int(S3Upload.partSize(chunkSize))
        } else if let chunkSize {
            object["chunk_size"] = .int(chunkSize)
        }
        return .object(object)
    }

    /// The API's view with what the upload learned from the server (docs/decisions.md): for `auto`, the
    /// protocol it picked (`protocol_selected`, null until the server answered) and a fallback
    /// after the server forgot the upload; for `ietf`, the interop version in use.
    public func json(selection checkpoint: TransferCheckpoint?) -> JSON {
        guard protocolName == .auto || protocolName == .ietf, case .object(var object) = json else { return json }
        if protocolName == .auto {
            object["protocol_selected"] = checkpoint?.protocolSelected.map { .string($0.rawValue) } ?? .null
            object["protocol_fallback"] = checkpoint?.fallback?.json ?? .null
        }
        let speaksIETF = protocolName == .ietf || checkpoint?.protocolSelected == .ietf
        object["interop_version_selected"] = speaksIETF ? checkpoint?.interopVersion.map { .int(Int64($0)) } ?? .null : .null
        return .object(object)
    }

    public static func decode(_ value: JSON?, path: String = "upload") throws(ValidationError) -> UploadSpec {
        guard let value, !value.isNull else { return UploadSpec() }
        let reader = try FieldReader(value, path: path)
        try reader.rejectUnknown([
            "protocol", "field", "filename", "content_type", "fields", "chunk_size", "s3", "checksum",
            "interop_version",
        ])
        var spec = UploadSpec()
        if let name = try reader.string("protocol", maxLength: 32) {
            guard let parsed = UploadProtocol(rawValue: name) else {
                throw ValidationError(reader.field("protocol"), "must be one of raw, multipart, chunked, tus, s3, ietf, auto")
            }
            guard UploadProtocol.supported.contains(parsed) else {
                throw ValidationError(reader.field("protocol"), "\(name) is not available in this version")
            }
            spec.protocolName = parsed
        }
        if let field = try reader.string("field", maxLength: 256) {
            guard !field.isEmpty else { throw ValidationError(reader.field("field"), "must not be empty") }
            spec.field = field
        }
        spec.filename = try reader.string("filename", maxLength: 1024)
        spec.contentType = try reader.string("content_type", maxLength: 256)
        if let type = spec.contentType, type.unicodeScalars.contains(where: { $0.value < 0x20 }) {
            throw ValidationError(reader.field("content_type"), "must not contain control characters")
        }
        if let fields = try reader.stringMap("fields", maxEntries: 100, maxValueLength: 65_536) {
            spec.fields = fields
        }
        spec.chunkSize = try reader.integer("chunk_size", in: 1...(5 << 30))
        if spec.protocolName == .ietf, spec.chunkSize != nil {
            throw ValidationError(
                reader.field("chunk_size"),
                "is not used by the ietf protocol: the file goes in one request, resumed from the server's offset")
        }
        if spec.protocolName != .multipart, !spec.fields.isEmpty {
            throw ValidationError(reader.field("fields"), "is only for the multipart protocol")
        }
        if let s3 = try reader.object("s3") { spec.s3 = try S3Credentials.decode(s3) }
        if let name = try reader.string("checksum", maxLength: 16) {
            guard let algorithm = ChecksumAlgorithm(rawValue: name) else {
                throw ValidationError(reader.field("checksum"), "must be sha256")
            }
            if spec.protocolName == .multipart, spec.fields.contains(where: { $0.0 == MultipartPlan.digestFieldName }) {
                throw ValidationError(
                    reader.field("fields"),
                    "must not have a field named \(MultipartPlan.digestFieldName): the checksum goes there")
            }
            spec.checksum = algorithm
        }
        if let version = try reader.integer("interop_version", in: 0...1000) {
            guard spec.protocolName == .ietf || spec.protocolName == .auto else {
                throw ValidationError(reader.field("interop_version"), "is only for the ietf and auto protocols")
            }
            guard IETFUpload.interopVersions.contains(Int(version)) else {
                throw ValidationError(
                    reader.field("interop_version"),
                    "must be one of \(IETFUpload.interopVersions.map(String.init).joined(separator: ", "))")
            }
            spec.interopVersion = Int(version)
        }
        if spec.protocolName == .s3 {
            guard spec.s3 != nil else { throw ValidationError(reader.field("s3"), "is required for the s3 protocol") }
            if let size = spec.chunkSize, size < S3Upload.minimumPartSize {
                throw ValidationError(reader.field("chunk_size"), "must be at least 5 MiB (5242880) for s3")
            }
        } else if spec.s3 != nil {
            throw ValidationError(reader.field("s3"), "is only for the s3 protocol")
        }
        return spec
    }
}
