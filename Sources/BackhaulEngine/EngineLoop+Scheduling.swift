import BackhaulCore
import BackhaulFiles
import BackhaulQueue
import Curl

/// Starting attempts: the scheduler picks, the policy decides, the store claims, the transfer
/// begins. A task starts only once the store shows it running (the claim committed): a transfer
/// never runs for a task the store does not know to be running.
extension EngineLoop {
    /// Starts queued tasks into free slots, in the scheduler's order.
    func schedule() {
        scheduleNeeded = false
        guard sessionsLoaded, mayStart() else { return }
        var free = options.maxConcurrentTransfers - active.count - claiming.count
        let context = policyContext()
        while free > 0, let entry = scheduler.next() {
            let task: TaskRecord
            do {
                if let created = createdCopies.removeValue(forKey: entry.sequence) {
                    task = created
                } else {
                    guard let read = try store.task(sequence: entry.sequence), read.state == .queued else { continue }
                    task = read
                }
            } catch .corrupt(let what) {
                // A row this build cannot read stays unreadable: it is set aside for this run (not
                // put back at the head of the queue, where it would hold every task behind it).
                fault(
                    .corruptRecord, "a queued task cannot be read; it is set aside and the queue goes on",
                    ["task.seq": "\(entry.sequence)", "error": "\(what)"])
                continue
            } catch {
                fault(
                    .storeRead, "cannot read a queued task; trying again", ["task.seq": "\(entry.sequence)", "error": "\(error)"])
                scheduler.enqueue(entry)
                break
            }
            guard let merged = configuration(for: task) else { continue }
            let configuration: TransferConfiguration
            switch merged {
            case .success(let value): configuration = value
            case .failure(let error):
                failForConfiguration(task, error)
                continue
            }
            var decision = Policy.decide(configuration, in: context)
            if decision == .run, let source = credentialsMissing(task, configuration) {
                decision = .wait(.awsCredentials(from: source))
            }
            guard decision == .run else {
                // The network, the policy or the credential chain holds it (or ends it): out of the queue.
                applyPolicy(sequence: task.sequence, decision)
                continue
            }
            claim(task, entry: entry, configuration: configuration)
            free -= 1
        }
        publishSaturation()
    }

    /// Whether the task lacks what it signs with: an `s3` task that takes its keys from the AWS
    /// credential chain starts only once the chain holds some. `.some(source)` (the source the
    /// chain asks, nil while it has named none) when it must wait. Asking never waits: a lookup
    /// runs on the chain's thread, and its end makes the loop review the tasks it held.
    func credentialsMissing(_ task: TaskRecord, _ configuration: TransferConfiguration) -> AWSCredentialSource?? {
        guard task.upload.s3?.isFromChain == true, configuration.signer == nil, let chain = options.awsCredentials else {
            return nil
        }
        guard chain.keys() == nil else { return nil }
        logger.info(
            "an s3 task waits for the AWS credential chain",
            metadata: ["task.id": "\(task.id)", "error": "\(chain.lastError ?? "the chain is asking its source")"])
        return .some(chain.source)
    }

    /// Writes a policy decision for a task. One that holds it for AWS keys asks the chain again
    /// once it is written: a lookup that ended between the decision and its commit woke a review
    /// that could not see the task held yet, and nothing else would wake another (a lost wake-up:
    /// `s3ChainExpiredTokenRetries` waited for good now and then).
    func applyPolicy(sequence: Int64, _ decision: PolicyDecision) {
        guard case .wait(let reason) = decision, WaitingReason.awsCredentialReasons.contains(reason),
            let chain = options.awsCredentials
        else { return store.applyPolicy(sequence: sequence, decision) }
        store.applyPolicy(sequence: sequence, decision) { [inbox = engine.inbox] _ in
            if chain.keys() != nil { inbox.requestPolicyReview() }
        }
    }

    /// Asks the store to mark the task running; the transfer begins when the claim is back.
    func claim(_ task: TaskRecord, entry: Scheduler.Entry, configuration: TransferConfiguration) {
        claiming.insert(task.sequence)
        scheduler.started(entry.key)
        store.startAttempt(task) { [inbox = engine.inbox] result in
            inbox.post { loop in loop.claimed(entry, configuration, result) }
        }
    }

    /// The claim is back: the transfer begins, or the slot is given back (the task moved on, or
    /// the engine is stopping).
    func claimed(_ entry: Scheduler.Entry, _ configuration: TransferConfiguration, _ result: Result<TaskRecord?, StoreError>) {
        claiming.remove(entry.sequence)
        scheduleNeeded = true
        switch result {
        case .success(let started?) where stopDeadline == nil:
            if !begin(started, configuration: configuration, key: entry.key) { scheduler.ended(entry.key) }
        case .success(let started?):
            // Claimed while stopping: straight back to the queue, no attempt counted.
            scheduler.ended(entry.key)
            record(started, bytesTransferred: 0, .interrupted)
        case .success(nil):
            scheduler.ended(entry.key)
        case .failure(let error):
            scheduler.ended(entry.key)
            fault(.storeWrite, "cannot start a task", ["task.seq": "\(entry.sequence)", "error": "\(error)"])
        }
    }

    /// A task's configuration: its session's with its own overrides applied. Nil when the session
    /// is unknown; a failure when the overrides cannot be applied, which must not be papered over
    /// with the session's configuration (that would drop a restriction such as
    /// `allows_cellular_access: false`).
    func configuration(for task: TaskRecord) -> Result<TransferConfiguration, ValidationError>? {
        guard let session = sessionConfigurations[task.sessionID] else { return nil }
        guard !task.configurationOverrides.isEmpty else { return .success(session) }
        return Result { () throws(ValidationError) in try session.applying(.object(task.configurationOverrides)) }
    }

    /// A task whose own configuration cannot be applied fails, saying why, instead of running
    /// with less than it asked for.
    func failForConfiguration(_ task: TaskRecord, _ error: ValidationError) {
        fault(
            .invalidConfiguration, "a task's configuration cannot be applied; the task fails",
            ["task.id": "\(task.id)", "error": "\(error)"])
        let failure = TaskError(
            .unknown, message: "the task's configuration cannot be applied over its session's: \(error.description)")
        store.applyPolicy(sequence: task.sequence, .fail(failure))
    }

    /// Starts one attempt of a task the store shows running; false when it could not start (its
    /// end is recorded).
    func begin(_ started: TaskRecord, configuration: TransferConfiguration, key: Scheduler.Key) -> Bool {
        var task = started
        var file: OpenedFile?
        var part: PartFile?
        let opened =
            task.download.map { spec in
                PartFile.open(
                    destination: spec.destination, roots: options.allowedRoots, resuming: (task.checkpoint?.offset ?? 0) > 0
                ).map { part = $0 }
            } ?? OpenedFile.open(task.file, roots: options.allowedRoots).map { file = $0 }
        if case .failure(let error) = opened {
            logger.warning("the file cannot be opened", metadata: ["task.id": "\(task.id)", "error.name": "\(error.name)"])
            record(started, bytesTransferred: 0, .failed(error, nil))
            return false
        }
        if let part, let offset = task.checkpoint?.offset, offset > 0, part.size < offset {
            // The `.part` file lost bytes the checkpoint counts (removed or cut by hand): start over.
            logger.warning(
                "the .part file is shorter than its checkpoint; the download starts over", metadata: ["task.id": "\(task.id)"])
            task.checkpoint = nil
        }
        let headers = HeaderRules.merged(configuration.defaultHeaders, task.request.headers)
        var machine = makeMachine(for: task, headers: headers, key: key)
        let transfer: Transfer
        do {
            var step = machine.start(now: clock.now())
            transfer = try Transfer(
                task: task, started: started, configuration: configuration, limitKey: key, machine: machine,
                file: file, part: part, startedAt: clock.now(), easy: try spareHandle())
            transfer.fence = store.leaseFence
            active[task.id] = transfer
            transfer.background = pacedInBackground(transfer)
            if transfer.background { backgroundRunning = true }
            watchInformational(transfer)
            bandwidthDirty = true
            if let refused = locationRefusal(transfer, step) { step = .failed(.fatal(refused)) }
            guard case .send(let request) = step else {
                conclude(transfer, step: step)
                return true
            }
            try send(transfer, request)
        } catch let error as AWSCredentialError {
            // No keys to sign with yet (a credential source down, say): retried with backoff like
            // any transient failure, not the task's end.
            logger.warning("no AWS credentials for the task", metadata: ["task.id": "\(task.id)", "error": "\(error)"])
            if let transfer = active[task.id] {
                conclude(transfer, step: .failed(.transport(.other, message: error.description)))
                return true
            }
            record(started, bytesTransferred: 0, .failed(TaskError(.unknown, message: error.description), nil))
            return false
        } catch {
            logger.error("cannot start the transfer", metadata: ["task.id": "\(task.id)", "error": "\(error)"])
            if let transfer = active.removeValue(forKey: task.id) { hashing[transfer.task.id] = nil }
            record(
                started, bytesTransferred: 0,
                .failed(TaskError(.badServerResponse, message: "cannot start the transfer: \(error)"), nil))
            return false
        }
        logger.debug(
            "attempt started",
            metadata: [
                "task.id": "\(task.id)", "task.attempt": "\(task.attempts)",
                "upload.protocol": "\(task.upload.protocolName.rawValue)",
            ])
        return true
    }

    /// Whether the fleet's fence lets this node start transfers: not while its heartbeat has not
    /// reached the database for a lease less the margin. It starts again once a beat gets through
    /// (the store then asks for the queue to be read again).
    func mayStart() -> Bool {
        guard let fence = store.leaseFence else { return true }
        guard fence.allowsStarting() else {
            leaseLapsed()
            return false
        }
        if leaseLapseLogged {
            leaseLapseLogged = false
            logger.notice("the heartbeat reached the database again: this node takes work again")
        }
        return true
    }

    /// Says once per lapse why this node stopped sending: its heartbeat has not reached the
    /// database, so its leases may run out on the other nodes.
    func leaseLapsed() {
        guard !leaseLapseLogged, let deadline = store.leaseFence?.deadline else { return }
        leaseLapseLogged = true
        logger.warning(
            "the lease may run out: the database has not answered this node's heartbeat, so its transfers stop and it starts none until a beat gets through",
            metadata: [
                "lease.seconds": "\(deadline.lease)", "lease.margin_seconds": "\(deadline.margin)",
                "lease.last_beat_sent_seconds_ago": "\(((monotonicSeconds() - deadline.lastBeatSent) * 100).rounded() / 100)",
            ])
    }

    /// Keys at their connection limit, for the API (`waiting_reason: host_connection_limit`).
    func publishSaturation() {
        let saturated = Set(scheduler.saturatedKeys().map(\.description))
        engine.shared.withLock { $0.saturated = saturated }
    }
}
