/// `ietf`: Resumable Uploads for HTTP (draft-ietf-httpbis-resumable-upload), interop versions 3, 5
/// and 6 (drafts -01, -03 and -04/-05; the interop version names the wire format, not the draft).
///
/// - Version: `upload.interop_version` pins one. Otherwise the first attempt asks `OPTIONS
///   request.url` with `Upload-Draft-Interop-Version: 6` (the newest spoken here): an answer naming
///   a version spoken here (a refusal such as Apple's `400` with `Upload-Draft-Interop-Version: 3`
///   included) gives the version; an answer that names none (a `2xx` with `Upload-Limit`, a `405`)
///   leaves the newest. A creation refused the same way later (a `4xx` naming another version spoken
///   here) is sent again once in that version. The version is persisted with the upload resource.
/// - Creation: `request.method` to `request.url` with the whole file, announced as resumable
///   (`Upload-Incomplete: ?0` for 3, `Upload-Complete: ?1` for 5 and 6). The upload resource comes
///   in the `104 (Upload Resumption Supported)` informational response (its `Location`, only from a
///   104 of the version sent, as the draft requires), which the engine hands over while the body is
///   still streaming and persists at once. A 2xx final answer completes the task.
/// - Resuming (an upload resource is known): `HEAD` gives `Upload-Offset` and whether the upload is
///   already complete; then one `PATCH` with `Content-Type: application/partial-upload`,
///   `Upload-Offset` and the rest of the file, marked complete. A `409` asks `HEAD` again (at most
///   `maxConflicts` times per attempt); `404`/`410` means the server forgot the upload: a new one
///   is created. An offset the server holds equal to the size but not complete is finished by an
///   empty `PATCH` marked complete.
/// - Cancelling sends `DELETE` to the upload resource.
/// - With `checksum: sha256` each attempt asks `OPTIONS` whether the server wants digests
///   (`Want-Repr-Digest` or `Want-Content-Digest` naming `sha-256` with a non-zero weight, RFC 9530);
///   if it does, the creation and every `PATCH` carry `Repr-Digest` of the whole file, computed
///   before the request is sent. A server that refuses the upload for its digest fails the task
///   with its status (the bytes it holds are not the file's).
/// - Requests go without `Expect: 100-continue`: the version is settled before any body is sent,
///   and servers that never answer 100 (Apple's among them) would cost a second per request.
public struct IETFUpload: TransferStateMachine {
    /// The interop versions spoken here, oldest first.
    public static let interopVersions = [3, 5, 6]
    public static var newestVersion: Int { interopVersions.last! }
    /// `409`s answered in one attempt before it fails: a server that keeps disagreeing about the
    /// offset is broken, not slow.
    public static let maxConflicts = 3
    public static let versionHeader = "Upload-Draft-Interop-Version"
    public static let partialUploadType = "application/partial-upload"

    private enum State: Equatable {
        case idle, discovering, creating, probing
        case appending(from: Int64)
        case done
    }

    private var state = State.idle
    private let url: String
    private let method: String
    private let headers: [(String, String)]
    private let total: Int64
    private let contentType: String?
    private let pinned: Int?
    private let wantsChecksum: Bool
    /// The interop version in use: pinned, persisted, negotiated, or nil until asked.
    public private(set) var version: Int?
    /// The upload resource, once the server named it.
    public private(set) var location: String?
    /// Bytes the server holds (its `Upload-Offset`).
    public private(set) var offset: Int64
    /// Whether the server wants `Repr-Digest` (asked once per attempt, when the task wants checksums).
    public private(set) var digestsWanted: Bool?
    /// Versions the server refused in this attempt.
    private var refused: Set<Int> = []
    private var conflicts = 0
    /// What makes the stored task or checkpoint one this protocol cannot have written (nil: none).
    private let brokenState: String?

    public init(task: TaskRecord, headers: [(String, String)], checkpoint: TransferCheckpoint?) {
        url = task.request.url
        method = task.request.method
        self.headers = headers
        total = task.file.size
        contentType = task.upload.contentType
        pinned = task.upload.interopVersion
        wantsChecksum = task.upload.checksum == .sha256
        let stored = checkpoint?.interopVersion.flatMap { Self.interopVersions.contains($0) ? $0 : nil }
        version = pinned ?? stored
        // An upload resource is only usable in the version it was created with.
        location = version != nil && version == stored ? checkpoint?.location : nil
        offset = location == nil ? 0 : min(checkpoint?.offset ?? 0, task.file.size)
        brokenState = Self.brokenState(pinned: pinned, checkpoint: checkpoint)
    }

    /// A pinned version was checked against those spoken here when the task was made, and an
    /// upload resource is stored with the version it was created in. (A stored version not
    /// spoken here is no break: another build of the daemon may speak it; the upload starts over.)
    static func brokenState(pinned: Int?, checkpoint: TransferCheckpoint?) -> String? {
        if let pinned, !interopVersions.contains(pinned) {
            return "the task pins interop version \(pinned), which is not one spoken here"
        }
        guard let checkpoint, checkpoint.location != nil else { return nil }
        if checkpoint.interopVersion == nil {
            return "the stored checkpoint names an upload resource but not the interop version it was created in"
        }
        if checkpoint.offset < 0 { return "the stored checkpoint has the negative offset \(checkpoint.offset)" }
        return nil
    }

    /// Never below zero, though a broken stored checkpoint may say so (`brokenCheckpoint`).
    public var bytesAcknowledged: Int64 { state == .done ? total : max(0, offset) }

    public var checkpoint: TransferCheckpoint? {
        var checkpoint = TransferCheckpoint(offset: offset, location: location)
        checkpoint.interopVersion = version
        return checkpoint
    }

    /// `DELETE` of the upload resource. A cancel that lands before the 104 cannot release what
    /// the server may have created: nothing names it.
    public var cancellation: CleanupPlan? {
        guard let location, let version else { return nil }
        return CleanupPlan(request: PlannedRequest(method: "DELETE", url: location, headers: versioned(version), body: .empty))
    }

    public mutating func start(now: Timestamp) -> TransferStep {
        if let brokenState { return impossible(brokenState) }
        refused = []
        conflicts = 0
        if version == nil || (wantsChecksum && digestsWanted == nil) {
            state = .discovering
            return .send(
                PlannedRequest(method: "OPTIONS", url: url, headers: versioned(version ?? Self.newestVersion), body: .empty))
        }
        return resume()
    }

    public mutating func didReceiveInformational(_ response: ResponseHead) -> Bool {
        // A 104 of another version (or none) must be ignored (draft: Draft Version Identification).
        guard response.status == 104, let version,
            Self.integer(response.headers["upload-draft-interop-version"]) == Int64(version)
        else { return false }
        var changed = false
        if state == .creating, location == nil, let target = response.headers["location"], !target.isEmpty {
            location = TusUpload.resolve(target, against: url)
            changed = true
        }
        if location != nil, let acknowledged = Self.integer(response.headers["upload-offset"]), acknowledged > offset,
            acknowledged <= total
        {
            // Progress the server promises never to ask for again.
            offset = acknowledged
            changed = true
        }
        return changed
    }

    public mutating func didReceive(_ response: ResponseHead, now: Timestamp) -> TransferStep {
        let status = response.status
        switch state {
        case .discovering:
            if version == nil {
                version = Self.negotiatedVersion(response, asked: Self.newestVersion)
            }
            digestsWanted = (200..<300).contains(status) && Self.wantsSHA256(response)
            return resume()
        case .creating:
            if (200..<300).contains(status) {
                if let acknowledged = Self.integer(response.headers["upload-offset"]), acknowledged != total {
                    return fail("the server completed the upload at offset \(acknowledged) of \(total)")
                }
                offset = total
                state = .done
                return .completed
            }
            if let current = version, pinned == nil, (400..<500).contains(status),
                let named = Self.integer(response.headers["upload-draft-interop-version"]).map({ Int($0) }), named != current,
                Self.interopVersions.contains(named), !refused.contains(named)
            {
                // Refused in this version, with one named that is spoken here: create in that one.
                refused.insert(current)
                version = named
                location = nil
                offset = 0
                return create()
            }
            return failHTTP(response, now: now)
        case .probing:
            if status == 404 || status == 410 {
                return restart()
            }
            guard (200..<300).contains(status) else { return failHTTP(response, now: now) }
            guard let serverOffset = Self.integer(response.headers["upload-offset"]), serverOffset <= total else {
                return fail("the upload resource answered HEAD without a usable Upload-Offset")
            }
            offset = serverOffset
            if isComplete(response) {
                // The final answer was lost (a crash after the last byte): the server has it all.
                guard serverOffset == total else {
                    return fail("the server holds a complete upload of \(serverOffset) bytes for a file of \(total)")
                }
                state = .done
                return .completed
            }
            return append()
        case .appending(let from):
            if status == 409 {
                conflicts += 1
                guard conflicts <= Self.maxConflicts else { return failHTTP(response, now: now) }
                return probe()
            }
            if status == 404 || status == 410 {
                return restart()
            }
            guard (200..<300).contains(status) else { return failHTTP(response, now: now) }
            if let acknowledged = Self.integer(response.headers["upload-offset"]), acknowledged != total {
                return fail("the server acknowledged offset \(acknowledged) after appending \(total - from) bytes at \(from)")
            }
            offset = total
            state = .done
            return .completed
        case .idle, .done:
            return fail("a response came when none was expected")
        }
    }

    // MARK: Requests

    private mutating func resume() -> TransferStep {
        location == nil ? create() : probe()
    }

    /// The server forgot the upload: a new one.
    private mutating func restart() -> TransferStep {
        location = nil
        offset = 0
        return create()
    }

    private mutating func create() -> TransferStep {
        let version = version ?? Self.newestVersion
        self.version = version
        state = .creating
        var headers = versioned(version) + [Self.completeness(version), ("Expect", "")]
        if let contentType, !headers.contains(where: { $0.0.lowercased() == "content-type" }) {
            headers.append(("Content-Type", contentType))
        }
        return .send(
            withDigest(PlannedRequest(method: method, url: url, headers: headers, body: .file(offset: 0, length: total))))
    }

    private mutating func probe() -> TransferStep {
        guard let location, let version else {
            return impossible("a HEAD is due but the upload resource or its interop version is not known")
        }
        state = .probing
        return .send(PlannedRequest(method: "HEAD", url: location, headers: versioned(version), body: .empty))
    }

    private mutating func append() -> TransferStep {
        guard let location, let version else {
            return impossible("a PATCH is due but the upload resource or its interop version is not known")
        }
        state = .appending(from: offset)
        let headers =
            versioned(version).filter { $0.0.lowercased() != "content-type" } + [
                ("Upload-Offset", String(offset)), Self.completeness(version), ("Content-Type", Self.partialUploadType),
                ("Expect", ""),
            ]
        return .send(
            withDigest(
                PlannedRequest(
                    method: "PATCH", url: location, headers: headers,
                    body: .file(offset: offset, length: total - offset))))
    }

    private func withDigest(_ request: PlannedRequest) -> PlannedRequest {
        guard digestsWanted == true else { return request }
        var request = request
        request.digestHeader = DigestHeader(name: "Repr-Digest", prefix: "sha-256=:", suffix: ":", hashedRange: 0..<total)
        return request
    }

    private func versioned(_ version: Int) -> [(String, String)] {
        headers.filter { $0.0.lowercased() != Self.versionHeader.lowercased() } + [(Self.versionHeader, String(version))]
    }

    /// The request says it carries the rest of the upload: version 3 says "not incomplete".
    static func completeness(_ version: Int) -> (String, String) {
        version < 5 ? ("Upload-Incomplete", "?0") : ("Upload-Complete", "?1")
    }

    /// Whether an offset-retrieval answer says the upload is complete (version 3 says it with
    /// `Upload-Incomplete: ?0`; Apple's server sends the field of its version, others may send either).
    private func isComplete(_ response: ResponseHead) -> Bool {
        let complete = Self.boolean(response.headers["upload-complete"])
        let incomplete = Self.boolean(response.headers["upload-incomplete"])
        if (version ?? Self.newestVersion) < 5 { return incomplete.map { !$0 } ?? complete ?? false }
        return complete ?? incomplete.map { !$0 } ?? false
    }

    private mutating func failHTTP(_ response: ResponseHead, now: Timestamp) -> TransferStep {
        state = .idle
        return .failed(response, now: now, answers: .ietf)
    }

    private mutating func fail(_ message: String) -> TransferStep {
        state = .idle
        return .protocolViolation(message)
    }

    private mutating func impossible(_ message: String) -> TransferStep {
        state = .idle
        return .impossible(message)
    }

    // MARK: Reading the server's answers

    /// The version to speak after an `OPTIONS` that asked for `asked`: the one the answer names
    /// when it is spoken here (a server that took `asked`, or refused it naming its own), else
    /// `asked` (the answer named none, or only versions not spoken here).
    public static func negotiatedVersion(_ response: ResponseHead, asked: Int) -> Int {
        guard let named = integer(response.headers["upload-draft-interop-version"]).map({ Int($0) }),
            interopVersions.contains(named)
        else { return asked }
        return named
    }

    /// `Want-Repr-Digest` or `Want-Content-Digest` with `sha-256` at a non-zero weight (RFC 9530 §4).
    static func wantsSHA256(_ response: ResponseHead) -> Bool {
        for name in ["want-repr-digest", "want-content-digest"] {
            for member in (response.headers[name] ?? "").split(separator: ",") {
                let parts = member.split(separator: "=", maxSplits: 1).map { $0.trimmed() }
                if parts.count == 2, parts[0].lowercased() == "sha-256", let weight = Int(parts[1]), weight > 0 { return true }
            }
        }
        return false
    }

    /// A Structured Field Integer item (`Upload-Offset: 100`), parameters ignored; nil otherwise.
    static func integer(_ value: String?) -> Int64? {
        guard let value else { return nil }
        return HeaderNumber.count(value.split(separator: ";", maxSplits: 1).first.map { $0.trimmed() } ?? "")
    }

    /// A Structured Field Boolean item (`?1`, `?0`), parameters ignored; nil otherwise.
    static func boolean(_ value: String?) -> Bool? {
        switch value?.split(separator: ";", maxSplits: 1).first.map({ $0.trimmed() }) {
        case "?1": return true
        case "?0": return false
        default: return nil
        }
    }
}
