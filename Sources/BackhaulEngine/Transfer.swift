import BackhaulCore
import BackhaulFiles
import BackhaulQueue
import Curl
import Digest

/// One task's attempt in flight: the protocol's state machine, the open file, the curl handle
/// and what has come back so far. Lives on the engine thread only.
final class Transfer {
    var task: TaskRecord
    /// The task as the store started it: what the end of the attempt is written against.
    let started: TaskRecord
    let attempt: Int
    /// When the attempt began (wall clock), for its entry in the task's history.
    let startedAt: Timestamp
    let configuration: TransferConfiguration
    let limitKey: Scheduler.Key
    var machine: any TransferStateMachine
    /// The file an upload reads (nil for a download).
    let file: OpenedFile?
    /// The `.part` file a download writes (nil for an upload).
    let part: PartFile?
    /// Where the current response's body goes, once its head has been seen (downloads).
    var disposition: ResponseBodyTarget?
    /// Body bytes of the current response written to `part`.
    var received: Int64 = 0
    /// Set when the disk cannot hold the download: the task is cancelled with reason 2.
    var insufficientSpace = false
    /// Set while the `DownloadVerifier` has the finished `.part` file (the slot stays taken).
    var verifying = false
    /// When the `.part` file was last made durable (monotonic), and the offset then.
    var lastPartSync = monotonicSeconds()
    var lastPartSyncOffset: Int64 = 0
    /// The handle of the current request: a fresh one for each later request of the transfer
    /// (curl's connection cache lives in the multi handle, so connections are still reused).
    /// Reusing one handle across requests with `curl_easy_reset` crashed libcurl 7.88 when
    /// trailers were sent; between transfers the engine reuses only a handle whose request
    /// completed cleanly without trailers or a MIME body (`EasyHandle.isReusable`).
    private(set) var easy: EasyHandle
    /// What the handle had sent when the engine took it back (`releaseHandle`).
    private var sentAtRelease: Int64?
    /// Whether `easy` has been configured for a request: the first request takes the handle the
    /// transfer was made with, each later one a new handle.
    private var easyConfigured = false

    /// Where the current request body reads from the file.
    private var bodyStart: Int64 = 0
    private var bodyOffset: Int64 = 0
    private var bodyEnd: Int64 = 0
    /// Set when the file shrank under a read: the attempt fails `file_changed`.
    var fileChangedDuringRead = false
    /// Set when the connected peer's address was private and those are denied.
    var destinationRefused = false
    /// Set when a response named an upload resource the allow-list does not admit (docs/credentials.md):
    /// the attempt stops and the task fails with this error.
    var refusedLocation: TaskError?
    /// Set when no byte moved either way for `timeout_interval_for_request`.
    var idleTimedOut = false
    /// The fleet's fence (`LeaseFence`): no byte is handed to curl once it closes for this task.
    var fence: LeaseFence?
    /// Set when the fence stopped the request: the node may no longer hold the task's lease.
    var leaseLapsed = false
    private var lastActivity = monotonicSeconds()
    private var lastCounters: (Int64, Int64) = (0, 0)

    let response = ResponseCollector(bodyLimit: ResponseRecord.maxBodyBytes)
    /// What the signer's answers gave this attempt's requests that is secret (query values,
    /// header values), taken out of the stored response (`responseRecord`).
    var signerSecrets: Set<String> = []
    /// A body the protocol built in memory (S3's CompleteMultipartUpload).
    private let memory = MemoryBody()
    /// The SHA-256 of the body read so far, when the request sends digest trailers.
    private var digest: SHA256Hasher?
    /// A request waiting for the SHA-256 of its file range to fill its digest header.
    var pendingDigest: (request: PlannedRequest, hasher: SHA256Hasher, offset: Int64, end: Int64)?
    /// Bytes acknowledged before the current request plus what curl has sent of it.
    var requestBytesSent: Int64 = 0
    var bytesBeforeRequest: Int64 = 0

    /// What the server acknowledged, as last persisted.
    var checkpoint: TransferCheckpoint

    /// When the last `task.progress` event was written (monotonic), and at what byte count.
    var lastProgressEvent = monotonicSeconds()
    var lastProgressBytes: Int64 = 0

    /// Bytes already counted against a discretionary budget.
    var budgetCounted: Int64 = 0
    /// This transfer's share of the bandwidth limit (bytes/s, 0: none), as curl's limit.
    private(set) var sendSpeed: Int64 = 0
    /// Whether it runs as `background` (`ServicePolicy.networkServiceType(for:)`), kept by the engine.
    var background = false
    /// A background upload's share of its path's LEDBAT rate (bytes/s, nil: not paced), applied as
    /// the socket's pacing rate; the static limit above still applies: the least of the two wins.
    private(set) var pacedRate: Int64?
    /// What its path's controller last showed, for `progress.background`.
    var pacing: BackgroundPacing?
    /// `tcpi_total_retrans` at the last sample, to count the new ones.
    var lastRetransmits: Int64?

    /// Sets the bandwidth limit's share, on the request in flight too (curl reads it as it
    /// paces): what an upload sends, what a download receives.
    func limitSpeed(_ bytesPerSecond: Int64) throws {
        guard bytesPerSecond != sendSpeed else { return }
        sendSpeed = bytesPerSecond
        if part == nil { try easy.setSendSpeedLimit(bytesPerSecond) } else { try easy.setReceiveSpeedLimit(bytesPerSecond) }
    }

    /// Has the kernel pace the connection at `bytesPerSecond` (nil: no longer paced). Applied again
    /// at each step: the socket may be new (a request of its own each).
    func pace(_ bytesPerSecond: Int64?) {
        pacedRate = bytesPerSecond
        easy.setPacingRate(bytesPerSecond)
    }

    // Rate estimate (bytes/s), updated by the engine loop.
    var rate: Double = 0
    var lastSample: (time: Double, bytes: Int64)

    init(
        task: TaskRecord, started: TaskRecord, configuration: TransferConfiguration, limitKey: Scheduler.Key,
        machine: any TransferStateMachine, file: OpenedFile?, part: PartFile? = nil, startedAt: Timestamp,
        easy: EasyHandle
    ) throws {
        self.task = task
        self.started = started
        self.attempt = task.attempts
        self.startedAt = startedAt
        self.configuration = configuration
        self.limitKey = limitKey
        self.machine = machine
        self.file = file
        self.part = part
        self.easy = easy
        self.lastSample = (monotonicSeconds(), 0)
        self.checkpoint = task.checkpoint ?? TransferCheckpoint(offset: 0)
        installHandlers()
    }

    /// Bytes moved so far: sent for an upload, received into the `.part` file for a download.
    var bytesTransferred: Int64 {
        guard part != nil else { return bytesBeforeRequest + requestBytesSent }
        if case .write(let offset, _) = disposition { return offset + received }
        return machine.bytesAcknowledged
    }

    /// Bytes sent of the body so far, as the handle counted them: read from the handle until the
    /// engine takes it back, then as they were then.
    var bytesSent: Int64 { sentAtRelease ?? bytesBeforeRequest + easy.bytesUploaded }

    /// The most either count says moved (the handle's count runs ahead of the progress rounds).
    var bytesMoved: Int64 { max(bytesTransferred, bytesSent) }

    /// Marks the handle as the engine's again: what it sent is kept, and nothing reads it after.
    func releaseHandle() { sentAtRelease = bytesSent }

    /// Failed attempts since the server last acknowledged more bytes (what retry limits count).
    var failuresSinceProgress: Int { checkpoint.attempt == 0 ? attempt : attempt - checkpoint.attempt + 1 }

    private func installHandlers() {
        attachFileBody()
        response.attach(to: easy)
        if part != nil { attachDownloadBody() }
        // curl calls this at least once a second, idle or not: the request timeout is measured
        // here, exactly, rather than with CURLOPT_LOW_SPEED_TIME's averaged window.
        easy.onProgress = { [unowned self] uploaded, downloaded in
            requestBytesSent = uploaded
            // A `Location` refused mid-request (an IETF `104`): the request stops here.
            if refusedLocation != nil || !mayContinue() { return false }
            let now = monotonicSeconds()
            if (uploaded, downloaded) != lastCounters {
                lastCounters = (uploaded, downloaded)
                lastActivity = now
                return true
            }
            if now - lastActivity > configuration.timeoutIntervalForRequest {
                idleTimedOut = true
                return false
            }
            return true
        }
    }

    /// Request bodies come from the file (the handlers capture `self` unowned: the transfer owns
    /// the handle, never the reverse).
    private func attachFileBody() {
        easy.readBody = { [unowned self] buffer in readFile(into: buffer) }
        easy.seekBody = { [unowned self] offset in
            guard offset >= 0, bodyStart + offset <= bodyEnd else { return false }
            if digest != nil {
                // A digest cannot rewind: only a restart from the beginning is possible.
                guard offset == 0 else { return false }
                digest = SHA256Hasher()
            }
            bodyOffset = bodyStart + offset
            return true
        }
    }

    /// Whether the node may still move this task's bytes: false once the fleet's fence closed for
    /// it (docs/fleet.md, "When a node cannot reach the database").
    private func mayContinue() -> Bool {
        guard let fence, !fence.allowsSending(task.id) else { return true }
        leaseLapsed = true
        return false
    }

    private func readFile(into buffer: UnsafeMutableRawBufferPointer) -> ReadResult {
        guard mayContinue() else { return .abort }
        let remaining = bodyEnd - bodyOffset
        guard remaining > 0 else { return .bytes(0) }
        let window = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<Int(min(Int64(buffer.count), remaining))])
        let count = file?.read(at: bodyOffset, into: window) ?? 0
        guard count > 0 else {
            // The file ended early or cannot be read: it changed under the upload.
            fileChangedDuringRead = true
            return .abort
        }
        digest?.update(UnsafeRawBufferPointer(rebasing: window[0..<count]))
        bodyOffset += Int64(count)
        return .bytes(count)
    }

    var responseHead: ResponseHead {
        ResponseHead(status: response.status, received: response.headers, body: response.body)
    }

    /// The task's response as stored and shown: what a server repeats of the credentials (the
    /// signer's query values and headers of this attempt, S3's signature elements) is redacted.
    /// A success without a signer's secrets is stored as it came: the echoes redacted here come
    /// in refusals (S3's SignatureDoesNotMatch is a 403), and this runs at the end of every attempt.
    var responseRecord: ResponseRecord? {
        guard response.status != 0 else { return nil }
        if signerSecrets.isEmpty, response.status < 300 {
            return ResponseRecord(status: response.status, headers: response.headers, body: response.body)
        }
        let shown = ResponseRedaction.redact(headers: response.headers, body: response.body, secrets: signerSecrets)
        return ResponseRecord(status: response.status, headers: shown.headers, body: shown.body)
    }

    /// Configures a fresh handle for the next request the protocol asked for.
    func prepare(_ request: PlannedRequest, options: EngineOptions) throws {
        bytesBeforeRequest = machine.bytesAcknowledged
        requestBytesSent = 0
        response.reset()
        if easyConfigured {
            easy = try EasyHandle()
            installHandlers()
        }
        easyConfigured = true
        if options.denyPrivateDestinations {
            easy.allowPeer = { [unowned self] address in
                if DestinationRules.isPrivate(address: address) { destinationRefused = true }
                return !destinationRefused
            }
        }
        disposition = nil
        received = 0
        lastActivity = monotonicSeconds()
        lastCounters = (0, 0)
        var curl = RequestOptions(url: request.url, method: RequestOptions.Method(request.method))
        curl.tcpKeepAlive = true
        // A background transfer keeps its socket's unsent queue short: what it paces is not
        // already queued in the kernel (docs/policy.md).
        // Its own connection, so that what the pacer reads (TCP_INFO) is this transfer's socket.
        easy.notSentLowWatermark = background ? EngineLoop.backgroundNotSentLowWatermark : nil
        curl.ownConnection = background
        easy.initialPacingRate = background ? pacedRate ?? LedbatController.Parameters().startRate : nil
        curl.userAgent = options.userAgent
        curl.uploadBufferSize = options.uploadBufferSize
        // Downloads: larger pieces from curl mean fewer write calls into the `.part` file.
        if part != nil { curl.receiveBufferSize = 512 << 10 }
        if sendSpeed > 0 { if part == nil { curl.maxSendSpeed = sendSpeed } else { curl.maxReceiveSpeed = sendSpeed } }
        curl.connectTimeoutMilliseconds = Int(configuration.timeoutIntervalForRequest * 1000)
        curl.caBundle = options.caBundle
        var chainToken: String?
        if var signing = request.signing {
            if signing.isFromChain {
                guard let chain = options.awsCredentials else { throw AWSCredentialError("no AWS credential chain") }
                let keys = try chain.credentials()
                signing = signing.resolved(with: keys)
                chainToken = keys.sessionToken
            }
            // libcurl computes the SigV4 signature over the headers it sends, the session token's
            // (`x-amz-security-token`) included.
            curl.awsSigV4 = .init(
                region: signing.region, accessKeyID: signing.accessKeyID, secretAccessKey: signing.secretAccessKey)
        }
        attachFileBody()
        digest = nil
        easy.trailers = nil
        var lines = request.headers.map { "\($0.0): \($0.1)" }
        if let chainToken { lines.append("x-amz-security-token: \(chainToken)") }
        switch request.body {
        case .empty:
            (bodyStart, bodyOffset, bodyEnd) = (0, 0, 0)
        case .file(let offset, let length):
            (bodyStart, bodyOffset, bodyEnd) = (offset, offset, offset + length)
            if request.digestTrailers.isEmpty {
                curl.body = .stream(length: length)
            } else {
                // The digest is known only after the last byte is read: it goes in trailers, so
                // the body goes with chunked transfer encoding.
                let names = request.digestTrailers
                digest = SHA256Hasher()
                curl.body = .stream(length: nil)
                lines += ["Transfer-Encoding: chunked", "Trailer: \(names.joined(separator: ", "))"]
                easy.trailers = { [unowned self] in
                    guard let value = digest?.finish() else { return [] }
                    digest = nil
                    return names.map { "\($0): sha-256=:\(Base64.encode(value)):" }
                }
            }
            if !lines.contains(where: { $0.lowercased().hasPrefix("content-type:") }) {
                lines.append("Content-Type: application/octet-stream")
            }
        case .bytes(let bytes):
            (bodyStart, bodyOffset, bodyEnd) = (0, 0, 0)
            memory.replace(with: bytes)
            memory.attach(to: easy)
            curl.body = .stream(length: Int64(bytes.count))
        case .multipart(let plan):
            (bodyStart, bodyOffset, bodyEnd) = (0, 0, plan.fileLength)
            var trailing: (name: String, length: Int)?
            if let field = plan.digestField {
                // The file's SHA-256 follows it as a text field, known once the file part is read.
                digest = SHA256Hasher()
                trailing = (field, 64)
                easy.trailingFieldValue = { [unowned self] in
                    guard let value = digest?.finish() else { return [] }
                    digest = nil
                    return Array(SHA256Hasher.hex(value).utf8)
                }
            }
            try easy.setMultipartBody(
                fields: plan.fields.map { ($0.name, $0.value) }, fileField: plan.fileField,
                filename: plan.filename, contentType: plan.contentType, fileSize: plan.fileLength,
                trailingField: trailing)
            curl.body = .multipart
        }
        // Not for a signed request: libcurl's SigV4 signs the emptied `Expect:` line as a header
        // it then does not send, and S3 refuses the signature.
        if case .stream(let length?) = curl.body, length < Self.continueThreshold, request.signing == nil,
            !request.headers.contains(where: { $0.0.asciiLowercased == "expect" })
        {
            lines.append("Expect:")
        }
        curl.headers = lines
        try easy.configure(curl)
    }

    /// libcurl asks the server for `100 Continue` before every PUT or PATCH body and waits for it:
    /// a round trip, and a response more for the server to write, that spares sending a body the
    /// server would refuse. For a small body that costs more than it can save: below 1 MiB
    /// (libcurl's own threshold for a POST) the body goes at once. A protocol that sets `Expect`
    /// itself (the IETF upload's empty one) keeps its own.
    static let continueThreshold: Int64 = 1 << 20
}
