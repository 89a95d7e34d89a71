import BackhaulCore
import Curl
import Digest
import JSONCodec
import Logging

/// One question to a session's signer (docs/credentials.md), a POST on the engine's multi handle
/// beside the transfers: the engine's thread never waits for it, and curl ends it after
/// `EngineLoop.signerTimeout` seconds whatever the signer does.
final class SignerCall {
    /// Whose request it is: a transfer's, or a cleanup's (an upload released after a cancel).
    enum Owner {
        case transfer(Transfer)
        case cleanup(Cleanup)
    }

    let owner: Owner
    /// The request as the protocol planned it, which the answer is applied to.
    let request: PlannedRequest
    let target: SignTarget
    /// Where the answer is kept (`EngineLoop.signatures`), while it may serve again.
    let key: String
    let easy: EasyHandle
    let response = ResponseCollector(bodyLimit: 64 << 10)
    private let body: MemoryBody

    init(owner: Owner, request: PlannedRequest, target: SignTarget, key: String, body: [UInt8]) throws {
        self.owner = owner
        self.request = request
        self.target = target
        self.key = key
        self.body = MemoryBody(body)
        easy = try EasyHandle()
        response.attach(to: easy)
        self.body.attach(to: easy)
    }
}

extension EngineLoop {
    /// How long a signer has to answer (seconds), connection included.
    static let signerTimeout = 10

    /// Sends a request of a transfer: signed first when its session has a signer (from a kept
    /// signature while it is usable, else after asking the signer), then hashed when it carries a
    /// digest, then to curl.
    func send(_ transfer: Transfer, _ request: PlannedRequest) throws {
        guard let signer = transfer.configuration.signer else {
            try dispatch(transfer, request)
            return
        }
        let task = transfer.task
        let target = SignTarget.of(request, kind: task.kind, protocolName: task.upload.protocolName)
        let key = "\(target.step.rawValue) \(target.partNumber ?? 0) \(request.method) \(request.url)"
        if let kept = signatures[task.id]?[key], kept.usable(at: clock.now()) {
            try dispatch(transfer, signed(request, with: kept, for: transfer))
            return
        }
        try askSigner(signer, transfer, request, target: target, key: key)
    }

    /// `request` as `signature` says to send it; what the signature gave that is secret is noted on
    /// the transfer, to be kept out of its stored response.
    func signed(_ request: PlannedRequest, with signature: Signature, for transfer: Transfer) -> PlannedRequest {
        transfer.signerSecrets.formUnion(ResponseRedaction.secrets(of: signature, planned: request))
        return signature.applied(to: request)
    }

    /// Hands a request to curl, or first to the hasher when it carries a digest header.
    func dispatch(_ transfer: Transfer, _ request: PlannedRequest) throws {
        if transfer.startHashingIfNeeded(request) {
            hashing[transfer.task.id] = transfer
            return
        }
        try start(transfer, request)
    }

    /// Configures the transfer's handle for `request` and adds it to curl.
    func start(_ transfer: Transfer, _ request: PlannedRequest) throws {
        try transfer.prepare(request, options: options)
        try curl.add(transfer.easy, for: self)
        byHandle[ObjectIdentifier(transfer.easy)] = transfer
    }

    /// POSTs the signer the task and the request, signed as a Standard Webhook with the signer's
    /// secret; `finishedSigner` takes the answer.
    func askSigner(
        _ signer: SignerConfiguration, _ transfer: Transfer, _ request: PlannedRequest, target: SignTarget, key: String
    ) throws {
        try askSigner(signer, .transfer(transfer), task: transfer.task, request, target: target, key: key)
    }

    /// Asks the signer for a cleanup's request (step `abort`), which goes once it answers.
    func askSigner(_ signer: SignerConfiguration, for cleanup: Cleanup, of task: TaskRecord) throws {
        let request = cleanup.plan.request
        let target = SignTarget.of(request, kind: task.kind, protocolName: task.upload.protocolName, cleanup: true)
        try askSigner(signer, .cleanup(cleanup), task: task, request, target: target, key: "")
    }

    private func askSigner(
        _ signer: SignerConfiguration, _ owner: SignerCall.Owner, task: TaskRecord, _ request: PlannedRequest,
        target: SignTarget, key: String
    ) throws {
        let body = SignRequest.body(task: task, target: target, request: request).serializedBytes()
        let now = clock.now()
        let id = RandomID.make(prefix: "sign_", at: now)
        let timestamp = Int64(now)
        let call = try SignerCall(owner: owner, request: request, target: target, key: key, body: body)
        if options.denyPrivateDestinations { call.easy.allowPeer = { !DestinationRules.isPrivate(address: $0) } }
        var curlOptions = RequestOptions(url: signer.url, method: .post)
        curlOptions.body = .stream(length: Int64(body.count))
        curlOptions.timeoutSeconds = Self.signerTimeout
        curlOptions.userAgent = options.userAgent
        curlOptions.caBundle = options.caBundle
        curlOptions.headers = WebhookSigner.headerLines(
            keys: WebhookRecord.key(of: signer.secret).map { [$0] } ?? [], id: id, timestamp: timestamp, body: body)
        try call.easy.configure(curlOptions)
        try curl.add(call.easy, for: self)
        signerCalls[ObjectIdentifier(call.easy)] = call
        logger.debug("asking the signer", metadata: ["task.id": "\(task.id)", "signer.step": "\(target.step.rawValue)"])
    }

    /// The signer answered (or did not within the bound): the request goes as signed, or the
    /// attempt ends (a transient failure is retried with backoff; a refusal ends the task).
    func finishedSigner(_ call: SignerCall, code: CurlCode) {
        let transfer: Transfer
        switch call.owner {
        case .cleanup(let cleanup):
            finishedSigner(call, code: code, for: cleanup)
            return
        case .transfer(let owner): transfer = owner
        }
        guard active[transfer.task.id] === transfer else { return }
        let outcome = Self.outcome(of: call, code: code)
        let status = code == .ok ? call.response.status : 0
        let metadata: Logger.Metadata = [
            "task.id": "\(transfer.task.id)", "signer.step": "\(call.target.step.rawValue)", "http.status": "\(status)",
        ]
        let refusal: TaskError?
        if case .signed(let signature) = outcome {
            refusal = options.destinations.locationRefusal(signature.url, taskURL: transfer.task.request.url)
        } else {
            refusal = nil
        }
        count(outcome, outsideAllowList: refusal != nil)
        switch outcome {
        case .signed(let signature):
            if var refused = refusal {
                // The message names the origin only: the signed URL's query is a credential.
                refused.message = refused.message.replacing("the server named", with: "the signer named")
                logger.warning("the signer named a host outside the upload allow-list", metadata: metadata)
                conclude(transfer, step: .failed(.fatal(refused)))
                return
            }
            if signature.usable(at: clock.now()) { signatures[transfer.task.id, default: [:]][call.key] = signature }
            do {
                try dispatch(transfer, signed(call.request, with: signature, for: transfer))
            } catch {
                conclude(transfer, step: .failed(.transport(.other, message: "cannot continue: \(error)")))
            }
        case .transient(let message):
            logger.warning(
                "the signer did not sign; the attempt is retried", metadata: metadata.merging(["error": "\(message)"]) { $1 })
            conclude(transfer, step: .failed(.transport(.other, message: message)))
        case .failed(let error):
            logger.warning("the signer's answer ends the task", metadata: metadata.merging(["error": "\(error.message)"]) { $1 })
            conclude(transfer, step: .failed(.fatal(error)))
        }
    }

    /// Counts an answer for `backhaul_signer_requests_total` (a signed URL outside the upload
    /// allow-list is an answer that cannot be used: `invalid`).
    func count(_ outcome: SignerOutcome, outsideAllowList: Bool) {
        let label: String
        switch outcome {
        case .signed: label = outsideAllowList ? "invalid" : "ok"
        case .transient: label = "transient"
        case .failed(let error): label = error.reason == .signerRefused ? "refused" : "invalid"
        }
        metrics.signerRequests[label, default: 0] += 1
    }

    /// What the signer's answer (or its absence) means.
    static func outcome(of call: SignerCall, code: CurlCode) -> SignerOutcome {
        let status = code == .ok ? call.response.status : 0
        let json = status == 200 ? try? JSON.parse(call.response.body) : nil
        let reason = code == .operationTimedOut ? "no answer within \(signerTimeout) s" : code == .ok ? nil : code.message
        return SignerOutcome.decide(status: status, json: json, transportError: reason)
    }

    /// A cleanup's request goes as the signer answered (within the upload allow-list), or the
    /// cleanup's attempt counts as failed and is retried later like one the server refused.
    func finishedSigner(_ call: SignerCall, code: CurlCode, for cleanup: Cleanup) {
        let metadata: Logger.Metadata = ["cleanup.seq": "\(cleanup.sequence)"]
        let outcome = Self.outcome(of: call, code: code)
        let outside: Bool
        if case .signed(let signature) = outcome {
            outside = options.destinations.allowListRefusal(signature.url, for: .upload) != nil
        } else {
            outside = false
        }
        count(outcome, outsideAllowList: outside)
        guard case .signed(let signature) = outcome else {
            logger.warning("the signer did not sign a cleanup; it is tried again later", metadata: metadata)
            finishedCleanup(cleanup, code: .couldNotConnect)
            return
        }
        if outside {
            logger.warning("dropping a cleanup the signer sent outside the upload allow-list", metadata: metadata)
            do { try store.recordCleanup(sequence: cleanup.sequence, retryAt: nil) } catch {
                fault(.storeWrite, "cannot drop a cleanup", ["error": "\(error)"])
            }
            return
        }
        do {
            try send(cleanup, signature.applied(to: call.request), curl)
        } catch {
            fault(.curl, "cannot start a cleanup request", ["error": "\(error)"])
            finishedCleanup(cleanup, code: .couldNotConnect)
        }
    }

    /// Takes a transfer's questions to the signer out of curl (it stopped or ended).
    func cancelSignerCalls(of transfer: Transfer) {
        guard !signerCalls.isEmpty else { return }
        for (id, call) in signerCalls {
            guard case .transfer(let owner) = call.owner, owner === transfer else { continue }
            curl.remove(call.easy)
            signerCalls[id] = nil
        }
    }

    /// Forgets a task's kept signatures (it ended, or its signed URL expired early). Most sessions
    /// have no signer and keep none: then the task's id is not even hashed.
    func forgetSignatures(of taskID: String) {
        guard !signatures.isEmpty else { return }
        signatures[taskID] = nil
    }

    /// Forgets the signatures no request may use any more (kept only until their `expires_at`,
    /// less the renewal margin), at most once every few seconds.
    func forgetSpentSignatures(_ monotonic: Double) {
        guard !signatures.isEmpty, monotonic - lastSignatureSweep >= 5 else { return }
        lastSignatureSweep = monotonic
        let now = clock.now()
        for (task, kept) in signatures {
            let usable = kept.filter { $0.value.usable(at: now) }
            signatures[task] = usable.isEmpty ? nil : usable
        }
    }
}
