import JSONValue

/// What a resumable transfer (upload or download) persists between attempts and across restarts.
public struct TransferCheckpoint: Sendable, Equatable {
    /// Bytes the server acknowledged.
    public var offset: Int64
    /// The attempt in which the offset last advanced (retry limits count failures after it).
    public var attempt: Int
    /// The upload's own identity at the server: a tus upload URL, an S3 UploadId.
    public var location: String?
    /// S3: the ETags of the parts uploaded, in order.
    public var parts: [String]
    /// S3 with checksums: each part's base64 SHA-256 as the server confirmed it ("" if none).
    public var partChecksums: [String]
    /// Downloads: what identifies the representation the offset belongs to (`etag:` or `date:`).
    public var validator: String?
    /// Downloads: the size of the whole representation, once the server said it.
    public var total: Int64?
    /// `auto`: the protocol picked for the task (it stays, unless the server forgets the upload).
    public var protocolSelected: UploadProtocol?
    /// `ietf`: the interop version the upload resource was created with.
    public var interopVersion: Int?
    /// `auto`: the last time the server forgot an upload and the protocol was picked again.
    public var fallback: ProtocolFallback?

    public init(offset: Int64, attempt: Int = 0, location: String? = nil, parts: [String] = [], partChecksums: [String] = []) {
        self.offset = offset
        self.attempt = attempt
        self.location = location
        self.parts = parts
        self.partChecksums = partChecksums
    }

    public var json: JSON {
        var object: JSONObject = ["offset": .int(offset), "attempt": .int(Int64(attempt))]
        if let location { object["location"] = .string(location) }
        if !parts.isEmpty { object["parts"] = .array(parts.map { .string($0) }) }
        if partChecksums.contains(where: { !$0.isEmpty }) { object["part_checksums"] = .array(partChecksums.map { .string($0) }) }
        if let validator { object["validator"] = .string(validator) }
        if let total { object["total"] = .int(total) }
        if let protocolSelected { object["protocol_selected"] = .string(protocolSelected.rawValue) }
        if let interopVersion { object["interop_version"] = .int(Int64(interopVersion)) }
        if let fallback { object["fallback"] = fallback.json }
        return .object(object)
    }

    public init?(_ json: JSON?) {
        guard let json, let offset = json["offset"]?.intValue else { return nil }
        self.offset = offset
        // Never below zero: the engine counts failures since this attempt by subtracting it.
        self.attempt = Int(max(0, json["attempt"]?.intValue ?? 0))
        self.location = json["location"]?.stringValue
        self.parts = json["parts"]?.arrayValue?.compactMap(\.stringValue) ?? []
        self.partChecksums = json["part_checksums"]?.arrayValue?.compactMap(\.stringValue) ?? []
        self.validator = json["validator"]?.stringValue
        self.total = json["total"]?.intValue
        if let name = json["protocol_selected"]?.stringValue {
            guard let selected = UploadProtocol(rawValue: name) else { return nil }
            self.protocolSelected = selected
        }
        self.interopVersion = json["interop_version"]?.intValue.map { Int($0) }
        if let fallback = json["fallback"] {
            guard let decoded = ProtocolFallback(fallback) else { return nil }
            self.fallback = decoded
        }
    }

    /// Same progress, ignoring which attempt recorded it.
    public func samePlace(as other: TransferCheckpoint) -> Bool {
        offset == other.offset && location == other.location && parts == other.parts && partChecksums == other.partChecksums
            && validator == other.validator && total == other.total && protocolSelected == other.protocolSelected
            && interopVersion == other.interopVersion && fallback == other.fallback
    }
}
