import JSONValue

/// `auto`'s rules (docs/decisions.md): one `OPTIONS` on `request.url` picks, in this order, `ietf` (the
/// answer shows `Upload-Draft-Interop-Version` or `Upload-Limit`), `tus` (`Tus-Resumable` or
/// `Tus-Version`), else `raw`.
public enum ProtocolSelection {
    /// A protocol picked for a host, with the interop version to speak when it is `ietf`.
    public struct Choice: Sendable, Equatable {
        public var protocolName: UploadProtocol
        public var interopVersion: Int?
        public init(_ protocolName: UploadProtocol, interopVersion: Int? = nil) {
            self.protocolName = protocolName
            self.interopVersion = interopVersion
        }
    }

    /// The question: `OPTIONS` with the task's headers and `Upload-Draft-Interop-Version` of the
    /// newest version spoken here (servers of the draft, Apple's among them, only show themselves
    /// to a request that names one).
    public static func probe(url: String, headers: [(String, String)]) -> PlannedRequest {
        let versioned =
            headers.filter { $0.0.lowercased() != IETFUpload.versionHeader.lowercased() }
            + [(IETFUpload.versionHeader, String(IETFUpload.newestVersion))]
        return PlannedRequest(method: "OPTIONS", url: url, headers: versioned, body: .empty)
    }

    /// The pick an answer makes; nil when it decides nothing and the attempt ends with it instead:
    /// a transient status (408, 425, 429, 5xx: retried, asked again) or an authentication
    /// challenge (401, 407: the task waits for new headers). Any other answer, a `404` or `405`
    /// included, decides from its headers.
    public static func choose(_ response: ResponseHead) -> Choice? {
        let status = response.status
        if TransientAnswers.httpStatuses.contains(status) || status >= 500 || status == 401 || status == 407 || status < 200 {
            return nil
        }
        let headers = response.headers
        if headers["upload-draft-interop-version"] != nil || headers["upload-limit"] != nil {
            return Choice(.ietf, interopVersion: IETFUpload.negotiatedVersion(response, asked: IETFUpload.newestVersion))
        }
        if headers["tus-resumable"] != nil || headers["tus-version"] != nil { return Choice(.tus) }
        return Choice(.raw)
    }
}

/// A server that forgot the upload the picked protocol had made (`404`/`410` on its resource):
/// the protocol was picked again. Shown in the task as `upload.protocol_fallback`.
public struct ProtocolFallback: Sendable, Equatable {
    public var from: UploadProtocol
    public var status: Int

    public init(from: UploadProtocol, status: Int) {
        self.from = from
        self.status = status
    }

    public var json: JSON {
        [
            "from": .string(from.rawValue), "status": .int(Int64(status)),
            "reason": .string("the server no longer knew the \(from.rawValue) upload (\(status)); the protocol was picked again"),
        ]
    }

    public init?(_ json: JSON) {
        guard let name = json["from"]?.stringValue, let from = UploadProtocol(rawValue: name),
            let status = json["status"]?.intValue
        else { return nil }
        self.init(from: from, status: Int(status))
    }
}

/// `auto`: asks the server which protocol it speaks (`ProtocolSelection`), then runs that
/// protocol's machine. The pick is persisted in the checkpoint and stays for the task; the engine
/// also keeps it per session and host for the daemon's run (`cachedSelection`), so the next task
/// to the same host asks nothing. If the server later answers `404`/`410` to the picked protocol's
/// upload resource, it is asked again (bypassing that cache), the new pick starts afresh, and the
/// task records the fallback.
public struct AutoUpload: TransferStateMachine {
    private enum State: Equatable { case idle, selecting, delegating }

    private var state = State.idle
    private let task: TaskRecord
    private let headers: [(String, String)]
    /// The protocol picked (nil until the server answered).
    public private(set) var selection: ProtocolSelection.Choice?
    public private(set) var fallback: ProtocolFallback?
    private var inner: (any TransferStateMachine)?
    /// Where the request in flight went (a `404` there is about the upload resource or not).
    private var lastURL: String?
    /// A stored pick that `auto` never makes (nil: none): every attempt fails `internal_error`.
    private let brokenPick: UploadProtocol?

    public init(
        task: TaskRecord, headers: [(String, String)], checkpoint: TransferCheckpoint?,
        cachedSelection: ProtocolSelection.Choice? = nil
    ) {
        self.task = task
        self.headers = headers
        fallback = checkpoint?.fallback
        brokenPick = checkpoint?.protocolSelected.flatMap { Self.pickable.contains($0) ? nil : $0 }
        if let picked = checkpoint?.protocolSelected, Self.pickable.contains(picked) {
            let stored = ProtocolSelection.Choice(picked, interopVersion: checkpoint?.interopVersion)
            selection = stored
            inner = Self.machine(task: task, headers: headers, selection: stored, checkpoint: checkpoint)
        } else if let cachedSelection, Self.pickable.contains(cachedSelection.protocolName) {
            selection = cachedSelection
            inner = Self.machine(task: task, headers: headers, selection: cachedSelection, checkpoint: nil)
        }
    }

    static let pickable: Set<UploadProtocol> = [.ietf, .tus, .raw]

    /// The picked protocol's machine, from the task as if it had named that protocol.
    static func machine(
        task: TaskRecord, headers: [(String, String)], selection: ProtocolSelection.Choice,
        checkpoint: TransferCheckpoint?
    ) -> any TransferStateMachine {
        var picked = task
        picked.upload.protocolName = selection.protocolName
        var checkpoint = checkpoint
        if selection.protocolName == .ietf, checkpoint?.interopVersion == nil, let version = selection.interopVersion {
            // The version the OPTIONS found: the ietf machine need not ask again.
            checkpoint = checkpoint ?? TransferCheckpoint(offset: 0)
            checkpoint?.interopVersion = version
        }
        picked.checkpoint = checkpoint
        return TransferMachines.machine(for: picked, headers: headers)
    }

    public var bytesAcknowledged: Int64 { inner?.bytesAcknowledged ?? 0 }

    public var checkpoint: TransferCheckpoint? {
        var checkpoint = inner?.checkpoint ?? TransferCheckpoint(offset: 0)
        checkpoint.protocolSelected = selection?.protocolName
        checkpoint.interopVersion =
            selection?.protocolName == .ietf ? checkpoint.interopVersion ?? selection?.interopVersion : nil
        checkpoint.fallback = fallback
        return checkpoint
    }

    public var cancellation: CleanupPlan? { inner?.cancellation }

    public mutating func start(now: Timestamp) -> TransferStep {
        lastURL = nil
        if let brokenPick {
            state = .idle
            return .impossible("the stored checkpoint says auto picked \(brokenPick.rawValue), which it never picks")
        }
        guard inner != nil else { return select() }
        state = .delegating
        return delegate { $0.start(now: now) }
    }

    public mutating func didReceiveInformational(_ response: ResponseHead) -> Bool {
        guard state == .delegating, var machine = inner else { return false }
        defer { inner = machine }
        return machine.didReceiveInformational(response)
    }

    public mutating func didReceive(_ response: ResponseHead, now: Timestamp) -> TransferStep {
        switch state {
        case .selecting:
            guard let picked = ProtocolSelection.choose(response) else {
                state = .idle
                return .failed(response, now: now)
            }
            selection = picked
            inner = Self.machine(task: task, headers: headers, selection: picked, checkpoint: nil)
            state = .delegating
            return delegate { $0.start(now: now) }
        case .delegating:
            if response.status == 404 || response.status == 410, let from = selection?.protocolName,
                let resource = inner?.checkpoint?.location, lastURL == resource
            {
                // The server changed its mind (or forgot): ask it again.
                fallback = ProtocolFallback(from: from, status: response.status)
                selection = nil
                inner = nil
                return select()
            }
            return delegate { $0.didReceive(response, now: now) }
        case .idle:
            return .protocolViolation("a response came when none was expected")
        }
    }

    private mutating func select() -> TransferStep {
        state = .selecting
        let probe = ProtocolSelection.probe(url: task.request.url, headers: headers)
        lastURL = probe.url
        return .send(probe)
    }

    private mutating func delegate(_ event: (inout any TransferStateMachine) -> TransferStep) -> TransferStep {
        guard var machine = inner else {
            state = .idle
            return .impossible("auto has no picked protocol to hand the step to")
        }
        let step = event(&machine)
        inner = machine
        if case .send(let request) = step { lastURL = request.url }
        return step
    }
}
