import BackhaulCore
import BackhaulQueue
import Curl

/// What happens when a request ends: the protocol's state machine says what is next (another
/// request, the end, a failure); the retry planner decides on failures; the store records the
/// attempt's end (and the rules of Core say what it does to the task).
extension EngineLoop {
    func finished(_ transfer: Transfer, code: CurlCode, _ transfers: CurlTransfers) {
        let now = clock.now()
        var step: TransferStep
        if transfer.leaseLapsed {
            leaseLapsed()
            stop(transfer)
            return
        } else if let refused = transfer.refusedLocation {
            step = .failed(.fatal(refused))
        } else if transfer.idleTimedOut {
            let seconds = transfer.configuration.timeoutIntervalForRequest
            step = .failed(.transport(.timedOut, message: "no bytes moved for \(seconds) s (timeout_interval_for_request)"))
        } else if transfer.destinationRefused {
            step = .failed(
                .fatal(
                    TaskError(
                        .cannotConnectToHost,
                        message: "the destination resolved to a private address and private destinations are denied")))
        } else if transfer.fileChangedDuringRead {
            step = .failed(.fatal(TaskError(.fileChanged, message: "the file changed while it was being read")))
        } else if transfer.insufficientSpace {
            cancelForLackOfSpace(transfer)
            return
        } else if code != .ok {
            step = .failed(.transport(Self.transportFailure(code), message: code.message))
        } else {
            transfer.endDownloadBody()
            step = transfer.machine.didReceive(transfer.responseHead, now: now)
            if let refused = locationRefusal(transfer, step) {
                step = .failed(.fatal(refused))
            } else {
                persistCheckpoint(transfer)
            }
            rememberSelection(transfer)
        }
        if case .send(let next) = step {
            do {
                byHandle[ObjectIdentifier(transfer.easy)] = nil
                try send(transfer, next)
                return
            } catch {
                conclude(transfer, step: .failed(.transport(.other, message: "cannot continue: \(error)")))
                return
            }
        }
        conclude(transfer, step: step)
    }

    /// Why the transfer may not go where its machine now points (docs/credentials.md): the upload resource
    /// a server named, or the next request's URL (when `step` sends one), on a host the upload
    /// allow-list does not admit.
    func locationRefusal(_ transfer: Transfer, _ step: TransferStep? = nil) -> TaskError? {
        let rules = options.destinations
        let own = transfer.task.request.url
        // An S3 checkpoint's `location` is its upload id, not a URL.
        if transfer.task.upload.protocolName != .s3, let location = transfer.machine.checkpoint?.location,
            let refused = rules.locationRefusal(location, taskURL: own)
        {
            return refused
        }
        guard case .send(let request)? = step else { return nil }
        return rules.locationRefusal(request.url, taskURL: own)
    }

    /// Writes the end of an attempt and frees its slot. A download whose body is complete is first
    /// made durable and verified by the `DownloadVerifier`, holding its slot meanwhile.
    func conclude(_ transfer: Transfer, step concluded: TransferStep) {
        var step = concluded
        if case .failed = step, let moved = transfer.part.flatMap({ $0.checkPath() }) {
            // The destination's directory was swapped (docs/security.md): the task fails, and its
            // `.part` file goes through the directory it was made in, which the store's removal by
            // path cannot reach any more.
            transfer.part?.discard()
            step = .failed(.fatal(moved))
        }
        if case .completed = step, let part = transfer.part, let spec = transfer.task.download, !transfer.verifying {
            transfer.verifying = true
            verifier.submit(
                DownloadVerifier.Job(
                    taskID: transfer.task.id, attempt: transfer.attempt, part: part,
                    expectedSHA256: spec.expectedSHA256))
            return
        }
        release(transfer)
        let task = transfer.task
        let response = transfer.responseRecord
        let bytes = transfer.machine.bytesAcknowledged
        switch step {
        case .send:
            return
        case .completed:
            forgetSignatures(of: task.id)
            if let changed = transfer.file?.checkUnchangedAtPath() {
                record(transfer, bytesTransferred: bytes, .failed(changed, response))
                return
            }
            record(transfer, bytesTransferred: bytes, .completed(response))
        case .failed(var failure):
            if case .credentialsExpired(let status) = failure, task.upload.s3?.isFromChain == true,
                let chain = options.awsCredentials
            {
                // The chain's keys expired early (docs/credentials.md): asked again at once, and the attempt
                // retried with backoff instead of waiting for a client.
                chain.invalidate()
                failure = .credentialsRenewed(
                    status: status, message: "the AWS credentials expired; the chain is asked for new ones")
            } else if case .credentialsExpired(let status) = failure, transfer.configuration.signer != nil {
                // A signed URL that expired early: the signer is asked again at the retry.
                forgetSignatures(of: task.id)
                failure = .credentialsRenewed(status: status, message: "the signed request expired; the signer is asked again")
            }
            let decision = RetryPlanner.decide(
                failure, attempts: transfer.failuresSinceProgress, policy: transfer.configuration.retry,
                now: clock.now(), deadline: task.deadlineAt, random: RandomID.unit)
            switch decision {
            case .retry(let at):
                metrics.retries[Self.retryReason(failure), default: 0] += 1
                logger.info(
                    "attempt failed, will retry",
                    metadata: [
                        "task.id": "\(task.id)", "task.attempt": "\(transfer.attempt)", "retry.at": "\(RFC3339.format(at))",
                        "failure": "\(failure)",
                    ])
                record(transfer, bytesTransferred: bytes, .retry(at: at, failure.error, response))
                nextTimer = min(nextTimer ?? at, at)
            case .fail(let error):
                if error.code == TaskError.Kind.internalError.rawValue {
                    // The machine met a state it cannot reach (a broken stored checkpoint, say): this
                    // task ends here; the daemon and its other tasks go on.
                    fault(
                        .internalError, "a task's protocol state should be impossible; the task fails",
                        [
                            "task.id": "\(task.id)", "upload.protocol": "\(task.upload.protocolName.rawValue)",
                            "error.message": "\(error.message)",
                        ])
                }
                forgetSignatures(of: task.id)
                logger.info(
                    "task failed",
                    metadata: [
                        "task.id": "\(task.id)", "error.code": "\(error.code)", "error.name": "\(error.name)",
                        "error.reason": "\(error.reason?.rawValue ?? "-")",
                    ])
                record(transfer, bytesTransferred: bytes, .failed(error, response))
            case .authenticationRequired:
                let expired = failure.error.reason == .credentialsExpired
                logger.info(
                    "the task waits for new credentials",
                    metadata: ["task.id": "\(task.id)", "auth.reason": "\(expired ? "credentials_expired" : "unauthorized")"])
                record(transfer, bytesTransferred: bytes, .authenticationRequired(response, expired: expired))
            }
        }
    }

    /// Writes how a transfer's attempt ended, with its entry in the task's attempt history.
    /// `bytesTransferred` defaults to what the server acknowledged.
    func record(_ transfer: Transfer, bytesTransferred: Int64? = nil, _ end: AttemptEnd) {
        record(
            transfer.started, bytesTransferred: bytesTransferred ?? transfer.machine.bytesAcknowledged, end,
            history: history(of: transfer))
    }

    /// Writes how the attempt of `task` (as it started) ended; without `history`, as one that
    /// ended as it began (it could not start). A write that fails leaves the task shown running:
    /// it is put back in the queue by `requeueOrphans`.
    func record(_ task: TaskRecord, bytesTransferred: Int64, _ end: AttemptEnd, history: AttemptRecord? = nil) {
        let now = clock.now()
        let entry =
            history
            ?? AttemptRecord(
                startedAt: now, endedAt: now, bytesTransferred: 0, bytesReceived: 0, outcome: end.outcome,
                networkType: network.type)
        let id = task.id
        store.finishAttempt(task, bytesTransferred: bytesTransferred, end: end, history: entry) { [inbox = engine.inbox] result in
            guard case .failure(let error) = result else { return }
            inbox.post { loop in
                loop.fault(.storeWrite, "cannot record the end of an attempt", ["task.id": "\(id)", "error": "\(error)"])
                loop.orphansPossible = true
            }
        }
    }

    /// A transfer's attempt as its history shows it (the outcome is filled in when it is written).
    func history(of transfer: Transfer) -> AttemptRecord {
        let moved = transfer.bytesMoved
        let status = transfer.response.status
        return AttemptRecord(
            startedAt: transfer.startedAt, endedAt: clock.now(), bytesTransferred: transfer.part == nil ? moved : 0,
            bytesReceived: transfer.part == nil ? 0 : moved, outcome: .stopped, httpStatus: status == 0 ? nil : status,
            networkType: network.type)
    }

    /// Takes a transfer out of the engine: its handle out of curl, its slot freed.
    func release(_ transfer: Transfer) {
        guard active[transfer.task.id] === transfer else { return }
        // A download's received bytes are made durable and checkpointed before it stops, so the
        // next attempt asks only for the rest.
        if transfer.part != nil, !transfer.insufficientSpace, !transfer.verifying, transfer.syncPart() {
            persistCheckpoint(transfer)
        }
        // Bytes a short transfer sent between two progress rounds still count. What its handle sent
        // is read now, once: the handle may serve the next transfer from here on.
        transfer.releaseHandle()
        countSent(transfer, bytes: transfer.bytesMoved)
        if transfer.configuration.discretionary { flushBudget(force: true) }
        curl.remove(transfer.easy)
        cancelSignerCalls(of: transfer)
        if transfer.easy.isReusable, spareHandles.count < Self.spareHandleLimit { spareHandles.append(transfer.easy) }
        hashing[transfer.task.id] = nil
        active[transfer.task.id] = nil
        byHandle[ObjectIdentifier(transfer.easy)] = nil
        scheduler.ended(transfer.limitKey)
        bandwidthDirty = true
        scheduleNeeded = true
    }

    /// A handle for a new transfer: one a transfer released (`EasyHandle.isReusable`), made as
    /// good as new, else a new one. Recycled when taken, so a handle kept spare costs nothing.
    func spareHandle() throws -> EasyHandle {
        while let easy = spareHandles.popLast() {
            if (try? easy.recycle()) != nil { return easy }
        }
        return try EasyHandle()
    }

    /// Hashes the bodies of waiting requests, at most `hashBudget` bytes per turn so that running
    /// transfers are not starved; a request whose digest is done goes to curl.
    func advanceHashing(_ transfers: CurlTransfers) {
        var budget = Self.hashBudget
        for (id, transfer) in hashing where budget > 0 {
            let slice = budget / max(1, hashing.count)
            budget -= slice
            do {
                guard let request = try transfer.hashSlice(budget: max(slice, 1 << 20), buffer: hashBuffer) else { continue }
                hashing[id] = nil
                try start(transfer, request)
            } catch is Transfer.FileChanged {
                hashing[id] = nil
                conclude(
                    transfer, step: .failed(.fatal(TaskError(.fileChanged, message: "the file changed while it was being read"))))
            } catch {
                hashing[id] = nil
                conclude(transfer, step: .failed(.transport(.other, message: "cannot continue: \(error)")))
            }
        }
    }

    /// A resumable transfer's acknowledged offset is saved as it grows, so a crash or a retry
    /// resumes from there.
    func persistCheckpoint(_ transfer: Transfer) {
        guard var checkpoint = transfer.machine.checkpoint, !checkpoint.samePlace(as: transfer.checkpoint) else { return }
        checkpoint.attempt = checkpoint.offset > transfer.checkpoint.offset ? transfer.attempt : transfer.checkpoint.attempt
        transfer.checkpoint = checkpoint
        store.saveCheckpoint(sequence: transfer.task.sequence, attempt: transfer.attempt, checkpoint)
    }

    /// The label of a retried failure (one of `EngineMetrics.retryReasons`).
    static func retryReason(_ failure: AttemptFailure) -> String {
        switch failure {
        case .http(let status, _, _, _) where [408, 425, 429].contains(status): return "http_\(status)"
        case .http(let status, _, _, _) where status >= 500: return "http_5xx"
        case .http(let status, _, _, _) where status >= 400: return "http_4xx"
        case .checksumMismatch: return "checksum_mismatch"
        case .credentialsRenewed: return "credentials_expired"
        case .transport(.timedOut, _): return "timed_out"
        case .transport(.cannotConnect, _): return "cannot_connect"
        case .transport(.cannotFindHost, _): return "cannot_find_host"
        case .transport(.connectionLost, _): return "connection_lost"
        default: return "other"
        }
    }

    static func transportFailure(_ code: CurlCode) -> TransportFailure {
        switch code {
        case .couldNotResolveHost, .couldNotResolveProxy: return .cannotFindHost
        case .couldNotConnect: return .cannotConnect
        case .operationTimedOut: return .timedOut
        case .sslConnectError, .peerFailedVerification, .sslCACert: return .secureConnectionFailed
        case .sendError, .receiveError, .gotNothing, .partialFile, .http2, .http2Stream, .weirdServerReply, .sendFailRewind:
            return .connectionLost
        default: return .other
        }
    }
}
