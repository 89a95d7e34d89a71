import JSONValue

/// A task create request, validated except for the file system checks.
public struct TaskDraft: Sendable {
    public var kind: TaskKind
    public var filePath: String
    public var request: RequestSpec
    public var upload: UploadSpec
    public var priority: Double
    public var earliestBeginAt: Timestamp?
    public var description: String?
    public var idempotencyKey: String?
    public var deleteFileOnSuccess: Bool
    public var configurationOverrides: JSONObject
    /// For downloads: where the file goes (`filePath` is then its destination).
    public var download: DownloadSpec?

    static let commonFields: Set<String> = [
        "kind", "request", "priority", "earliest_begin_at", "description", "idempotency_key", "configuration",
    ]
    static let uploadFields = commonFields.union(["file", "upload", "delete_file_on_success", "s3"])
    static let downloadFields = commonFields.union(["destination", "overwrite", "expected_sha256"])

    public static let methods: Set<String> = ["PUT", "POST", "PATCH"]

    /// Validates one task object; `path` prefixes field names (`tasks[3]`).
    public static func decode(_ value: JSON, path: String = "", base: TransferConfiguration) throws(ValidationError) -> TaskDraft
    {
        let reader = try FieldReader(value, path: path)
        let kindName = try reader.string("kind", maxLength: 16) ?? "upload"
        guard let kind = TaskKind(rawValue: kindName) else {
            throw ValidationError(reader.field("kind"), "must be upload or download")
        }
        try reader.rejectUnknown(kind == .upload ? uploadFields : downloadFields)
        let file: String
        var upload = UploadSpec()
        var download: DownloadSpec?
        if kind == .download {
            file = try reader.requiredString("destination", maxLength: 4096)
            guard file.hasPrefix("/"), !file.hasSuffix("/") else {
                throw ValidationError(reader.field("destination"), "must be an absolute path to a file")
            }
            let digest = try reader.string("expected_sha256", maxLength: 64).map { $0.lowercased() }
            if let digest, digest.count != 64 || !digest.allSatisfy(\.isHexDigit) {
                throw ValidationError(reader.field("expected_sha256"), "must be 64 hexadecimal digits")
            }
            download = DownloadSpec(destination: file, overwrite: try reader.bool("overwrite") ?? false, expectedSHA256: digest)
        } else {
            file = try reader.requiredString("file", maxLength: 4096)
            guard file.hasPrefix("/") else { throw ValidationError(reader.field("file"), "must be an absolute path") }
        }

        guard let requestReader = try reader.object("request") else {
            throw ValidationError(reader.field("request"), "is required")
        }
        try requestReader.rejectUnknown(["url", "method", "headers"])
        let url = try requestReader.requiredString("url", maxLength: 8192)
        guard URLParts(url) != nil else {
            throw ValidationError(requestReader.field("url"), "must be an absolute http or https URL")
        }
        let method = (try requestReader.string("method", maxLength: 16) ?? (kind == .upload ? "PUT" : "GET")).uppercased()
        if kind == .download {
            guard method == "GET" else { throw ValidationError(requestReader.field("method"), "must be GET for a download") }
        } else {
            guard methods.contains(method) else {
                throw ValidationError(requestReader.field("method"), "must be PUT, POST or PATCH")
            }
        }
        let headers = try requestReader.stringMap("headers") ?? []
        for (name, value) in headers {
            try HeaderRules.validate(name: name, value: value, field: requestReader.field("headers"))
        }
        if kind == .upload {
            // OpenAPI/backhaul.yaml puts `s3` beside `upload`; it is kept with the upload's settings.
            var uploadValue = reader.value("upload") ?? .object([:])
            if let s3 = reader.value("s3"), case .object(var object) = uploadValue {
                guard object["s3"] == nil else { throw ValidationError(reader.field("s3"), "is given twice") }
                object["s3"] = s3
                uploadValue = .object(object)
            }
            upload = try UploadSpec.decode(uploadValue, path: reader.field("upload"))
        }
        let priority = try reader.number("priority", in: 0...1) ?? 0.5
        var overrides = JSONObject()
        if let configuration = reader.value("configuration") {
            if configuration.objectValue?["signer"] != nil {
                throw ValidationError(reader.field("configuration.signer"), "belongs to the session's configuration")
            }
            _ = try base.applying(configuration, path: reader.field("configuration"))
            overrides = configuration.objectValue ?? [:]
        }
        let key = try reader.string("idempotency_key", maxLength: 256)
        if let key, key.isEmpty { throw ValidationError(reader.field("idempotency_key"), "must not be empty") }
        return TaskDraft(
            kind: kind, filePath: file, request: RequestSpec(url: url, method: method, headers: headers), upload: upload,
            priority: priority, earliestBeginAt: try reader.timestamp("earliest_begin_at"),
            description: try reader.string("description", maxLength: 4096), idempotencyKey: key,
            deleteFileOnSuccess: try reader.bool("delete_file_on_success") ?? false, configurationOverrides: overrides,
            download: download)
    }
}
