import BackhaulCore
import BackhaulQueue
import Curl

/// Requests that release a cancelled task's server side (tus termination, S3 abort), queued by
/// the store in the cancelling transaction, sent beside the transfers and retried a few times.
final class Cleanup {
    let sequence: Int64
    let attempts: Int
    let plan: CleanupPlan
    let easy: EasyHandle
    let response = ResponseCollector(bodyLimit: ResponseRecord.maxBodyBytes)

    init(sequence: Int64, attempts: Int, plan: CleanupPlan) throws {
        self.sequence = sequence
        self.attempts = attempts
        self.plan = plan
        easy = try EasyHandle()
        response.attach(to: easy)
    }
}

extension EngineLoop {
    static let maxCleanupAttempts = 5
    static let maxCleanupsInFlight = 4

    func startCleanups(_ transfers: CurlTransfers) {
        // Claimed for a lease like tasks: none while the fleet's fence is closed.
        guard mayStart() else { return }
        cleanupsDue = false
        // Those waiting for the signer are in flight too.
        var busy = Set(cleanups.values.map(\.sequence))
        for call in signerCalls.values { if case .cleanup(let cleanup) = call.owner { busy.insert(cleanup.sequence) } }
        guard busy.count < Self.maxCleanupsInFlight else { return }
        let due: [DueCleanup]
        do {
            due = try store.dueCleanups(now: clock.now(), limit: Self.maxCleanupsInFlight - busy.count, excluding: busy)
        } catch {
            fault(.storeRead, "cannot read cleanups", ["error": "\(error)"])
            cleanupsDue = true
            return
        }
        for (sequence, read, attempts, taskID) in due {
            let plan: CleanupPlan
            switch read {
            case .success(let value): plan = value
            case .failure(let error):
                // A row nobody can read would otherwise be skipped, and kept, forever.
                fault(
                    .corruptRecord, "dropping a cleanup that cannot be read", ["cleanup.seq": "\(sequence)", "error": "\(error)"])
                do { try store.recordCleanup(sequence: sequence, retryAt: nil) } catch {
                    fault(.storeWrite, "cannot drop a cleanup", ["error": "\(error)"])
                }
                continue
            }
            if let refusal = options.destinations.allowListRefusal(plan.request.url, for: .upload) {
                // A server-given upload URL the allow-list does not admit: nothing goes there.
                logger.warning(
                    "dropping a cleanup outside the upload allow-list",
                    metadata: ["cleanup.seq": "\(sequence)", "refusal": "\(refusal)"])
                do { try store.recordCleanup(sequence: sequence, retryAt: nil) } catch {
                    fault(.storeWrite, "cannot drop a cleanup", ["error": "\(error)"])
                }
                continue
            }
            do {
                let cleanup = try Cleanup(sequence: sequence, attempts: attempts, plan: plan)
                // The task's session signs its releases too, when it has a signer (docs/credentials.md).
                if let task = try? store.task(id: taskID), let signer = sessionConfigurations[task.sessionID]?.signer {
                    try askSigner(signer, for: cleanup, of: task)
                    continue
                }
                try send(cleanup, plan.request, transfers)
            } catch {
                fault(.curl, "cannot start a cleanup request", ["error": "\(error)"])
            }
        }
    }

    /// Sends a cleanup's request: as planned (signed with SigV4 when it says so), or as the
    /// signer answered.
    func send(_ cleanup: Cleanup, _ request: PlannedRequest, _ transfers: CurlTransfers) throws {
        var options = RequestOptions(url: request.url, method: RequestOptions.Method(request.method))
        options.timeoutSeconds = 30
        options.caBundle = self.options.caBundle
        options.headers = request.headers.map { "\($0.0): \($0.1)" }
        if var signing = request.signing {
            if signing.isFromChain {
                guard let chain = self.options.awsCredentials else { throw AWSCredentialError("no AWS credential chain") }
                let keys = try chain.credentials()
                signing = signing.resolved(with: keys)
                if let token = keys.sessionToken { options.headers.append("x-amz-security-token: \(token)") }
            }
            options.awsSigV4 = .init(
                region: signing.region, accessKeyID: signing.accessKeyID, secretAccessKey: signing.secretAccessKey)
        }
        try cleanup.easy.configure(options)
        try transfers.add(cleanup.easy, for: self)
        cleanups[ObjectIdentifier(cleanup.easy)] = cleanup
    }

    /// 2xx, 404 and 410 end a cleanup (the server no longer holds the upload); other outcomes are
    /// retried a few times with backoff, then given up and logged. A listing that answered is
    /// replaced by the aborts of what it found.
    func finishedCleanup(_ cleanup: Cleanup, code: CurlCode) {
        cleanupsDue = true
        let status = code == .ok ? cleanup.response.status : 0
        if (200..<300).contains(status), cleanup.plan.abortListedUploads != nil {
            let found = cleanup.plan.followUps(listing: cleanup.response.body)
            do {
                let aborts = try store.replaceCleanup(sequence: cleanup.sequence, with: found)
                logger.info(
                    "listed the multipart uploads of a cancelled task",
                    metadata: [
                        "cleanup.found": "\(found.count)", "cleanup.aborts": "\(aborts)",
                    ])
            } catch {
                fault(.storeWrite, "cannot record a cleanup", ["error": "\(error)"])
            }
            return
        }
        let done = (200..<300).contains(status) || status == 404 || status == 410
        var retryAt: Timestamp?
        if !done {
            if cleanup.attempts + 1 < Self.maxCleanupAttempts {
                let at = clock.now() + 5 * Double(1 << cleanup.attempts)
                retryAt = at
                nextTimer = min(nextTimer ?? at, at)
            } else {
                logger.warning(
                    "giving up releasing a cancelled upload at the server",
                    metadata: [
                        "cleanup.status": "\(status)", "error": "\(code == .ok ? "" : code.message)",
                    ])
            }
        }
        do { try store.recordCleanup(sequence: cleanup.sequence, retryAt: retryAt) } catch {
            fault(.storeWrite, "cannot record a cleanup", ["error": "\(error)"])
        }
    }
}
