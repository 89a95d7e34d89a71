import JSONValue

/// What releases a cancelled task's server side (tus termination, S3 abort), queued in the
/// cancelling transaction and carried out by the engine, retried a few times.
public struct CleanupPlan: Sendable, Equatable {
    public var request: PlannedRequest
    /// S3, when the task may have created a multipart upload whose id it never learned (the
    /// cancel came while `CreateMultipartUpload` was in flight): `request` lists the multipart
    /// uploads, and each one of exactly this key that no unfinished task of this daemon holds is
    /// then aborted with a cleanup of its own.
    public var abortListedUploads: String?

    public init(request: PlannedRequest, abortListedUploads: String? = nil) {
        self.request = request
        self.abortListedUploads = abortListedUploads
    }

    /// The stored form (with the S3 credentials it signs with: the store is trusted).
    public var json: JSON {
        // Pairs, not an object: a header may repeat.
        let headers = JSON.array(request.headers.map { .array([.string($0.0), .string($0.1)]) })
        var object: JSONObject = ["method": .string(request.method), "url": .string(request.url), "headers": headers]
        if let signing = request.signing { object["signing"] = signing.json(redacted: false) }
        if let key = abortListedUploads { object["abort_listed_uploads"] = ["key": .string(key)] }
        return .object(object)
    }

    public static func decode(_ value: JSON) -> CleanupPlan? {
        guard let method = value["method"]?.stringValue, let url = value["url"]?.stringValue else { return nil }
        var headers: [(String, String)] = []
        switch value["headers"] {
        case .array(let pairs):
            for pair in pairs {
                guard let items = pair.arrayValue, items.count == 2, let name = items[0].stringValue,
                    let text = items[1].stringValue
                else { return nil }
                headers.append((name, text))
            }
        case .object(let object):
            // Rows written by v1 (a tus DELETE): an object of headers.
            for (name, header) in object {
                guard let text = header.stringValue else { return nil }
                headers.append((name, text))
            }
        default:
            return nil
        }
        var signing: S3Credentials?
        if let stored = value["signing"] {
            guard let region = stored["region"]?.stringValue, let key = stored["access_key_id"]?.stringValue,
                let secret = stored["secret_access_key"]?.stringValue
            else { return nil }
            signing = S3Credentials(
                region: region, accessKeyID: key, secretAccessKey: secret,
                sessionToken: stored["session_token"]?.stringValue)
        }
        var plan = CleanupPlan(
            request: PlannedRequest(method: method, url: url, headers: headers, body: .empty, signing: signing))
        if let listed = value["abort_listed_uploads"] {
            guard let key = listed["key"]?.stringValue else { return nil }
            plan.abortListedUploads = key
        }
        return plan
    }

    /// After the listing of an `abortListedUploads` plan answered: one abort per upload of exactly
    /// the key (with its upload id), for the store to keep those no unfinished task holds.
    /// S3 lists at most 1,000 uploads per answer; more under one prefix are not followed.
    public func followUps(listing body: [UInt8]) -> [(uploadID: String, plan: CleanupPlan)] {
        guard let key = abortListedUploads else { return [] }
        return XMLText.blocks("Upload", in: body).compactMap { block in
            let bytes = Array(block.utf8)
            guard XMLText.first("Key", in: bytes) == key, let id = XMLText.first("UploadId", in: bytes) else { return nil }
            var abort = request
            abort.method = "DELETE"
            abort.url = S3Upload.objectURL(fromListing: request.url, key: key) + "?uploadId=" + S3Upload.escape(id)
            return (id, CleanupPlan(request: abort))
        }
    }
}
