import BackhaulCore
import BackhaulQueue
import Curl
import Logging

/// The engine's state on the curl loop's thread (everything here is touched by that thread
/// only) and its turn: take what the store said, fire timers, decide again for the policy, start
/// queued tasks into free slots; after curl ran, conclude what ended and publish progress.
final class EngineLoop: CurlLoopClient {
    unowned let engine: Engine
    let store: any StateStore
    let logger: Logger
    let options: EngineOptions
    let clock: any Clock

    /// The runnable work, kept from the store's commits (loaded once at start, in pages).
    var scheduler = Scheduler()
    /// Where loading the queue is (nil once loaded).
    var loadingAfter: Int64? = 0
    /// Sequences whose claim is in flight (kept out of the scheduler meanwhile).
    var claiming: Set<Int64> = []
    /// Tasks as the store created them (queued), so a new task starts without being read back;
    /// dropped when the task changes or leaves the queue. At most `createdCopiesLimit`.
    var createdCopies: [Int64: TaskRecord] = [:]
    static let createdCopiesLimit = 4096
    var active: [String: Transfer] = [:]
    var byHandle: [ObjectIdentifier: Transfer] = [:]
    /// Easy handles of ended transfers, for the next ones (`spareHandle`): a handle reused costs
    /// a fraction of a new one's `curl_easy_init` and `curl_easy_cleanup`.
    var spareHandles: [EasyHandle] = []
    static let spareHandleLimit = 64
    /// Each session's configuration, kept from the store's commits.
    var sessionConfigurations: [String: TransferConfiguration] = [:]
    var sessionsLoaded = false

    // Timers: the earliest the store knows of, and whether a `fireTimers` is in flight.
    var nextTimer: Timestamp?
    var timersInFlight = false
    var lastTimerCheck = 0.0

    // Policy state (see EngineLoop+Policy).
    var lastNetworkCheck = 0.0
    var network = NetworkState.disconnected
    var policy = ServicePolicy()
    var policyReviewNeeded = true
    var nextPolicyEdge: Timestamp = 0
    var budgetDay = ""
    var budgetUsed: [NetworkType: Int64] = [:]
    var budgetPending: [NetworkType: Int64] = [:]
    var lastBudgetFlush = 0.0
    var budgetExceeded = false
    var bandwidthDirty = true
    /// Each background path's LEDBAT controller (EngineLoop+Background).
    var pacers: [String: Pacer] = [:]
    /// Whether a background transfer may be running: the pacing pass runs and the loop wakes often.
    var backgroundRunning = false
    var metrics = EngineMetrics()
    /// `auto`'s picks by session and host, for the daemon's run (EngineLoop+Resumable.swift).
    var protocolSelections: [Scheduler.Key: (choice: ProtocolSelection.Choice, at: Double)] = [:]

    /// Requests that release a cancelled task's server side (see EngineLoop+Cleanups).
    var cleanups: [ObjectIdentifier: Cleanup] = [:]
    var cleanupsDue = true
    /// Questions to a session's signer in flight (see EngineLoop+Signer).
    var signerCalls: [ObjectIdentifier: SignerCall] = [:]
    /// The signers' answers that may serve again, by task and request, in memory only and only
    /// until their `expires_at` (less the renewal margin).
    var signatures: [String: [String: Signature]] = [:]
    var lastSignatureSweep = 0.0
    /// Transfers whose next request waits for its body's digest (see `advanceHashing`).
    var hashing: [String: Transfer] = [:]
    static let hashBudget = 8 << 20
    let hashBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
    /// Syncs and checks finished downloads on a thread of its own.
    let verifier: DownloadVerifier
    /// A write that ends an attempt failed: the store may show tasks running that are not.
    var orphansPossible = false
    /// Something may start now: a slot came free, work was queued, a claim came back.
    var scheduleNeeded = true
    /// When the engine's held writes last went to the store (monotonic seconds).
    var writesReleasedAt = 0.0
    /// Whether the fence's lapse was logged (`leaseLapsed`), until the node may start again.
    var leaseLapseLogged = false
    var lastPublish = 0.0
    // What the service manager was last told (EngineLoop+Supervision).
    var lastWatchdog = -Double.infinity
    var lastStatus = -Double.infinity
    var lastStatusLine = ""
    /// The shutdown is complete (the loop has stopped for good).
    private(set) var isDone = false
    /// The worker's multi handle, as the worker hands it to each call.
    var curl: CurlTransfers!

    init(engine: Engine) {
        self.engine = engine
        store = engine.store
        logger = engine.logger
        options = engine.options
        clock = engine.clock
        verifier = DownloadVerifier { [curlLoop = engine.curlLoop] in curlLoop.wake() }
        verifier.start()
        policy = engine.settings.policy
        network = engine.network
        logger.info("engine started", metadata: ["engine.max_concurrent_transfers": "\(options.maxConcurrentTransfers)"])
    }

    deinit { hashBuffer.deallocate() }

    var stopDeadline: Double? { engine.shared.withLock { $0.stopDeadline } }

    // MARK: CurlLoopClient

    /// The store's writes of a turn go to the writer together when it ends, with the ends of the
    /// transfers curl finished just before (`finished` holds them, `afterPerform` keeps them held
    /// when the next turn comes at once): one transaction for a slot's end and its next claim,
    /// not one each, and a third fewer commits over many small uploads. While many transfers run,
    /// they wait for the turns of the next `writePacing` too (`releaseWritesWhenDue`).
    func turn(_ transfers: CurlTransfers) {
        curl = transfers
        store.holdWrites()
        defer { releaseWritesWhenDue() }
        stallIfAsked()
        superviseIfDue(monotonicSeconds())
        let (items, review) = engine.inbox.take()
        if review { policyReviewNeeded = true }
        for item in items {
            switch item {
            case .changes(let changes): take(changes)
            case .work(let work): work(self)
            }
        }
        let monotonic = monotonicSeconds()
        if let deadline = stopDeadline {
            // Running transfers may still finish (and downloads be placed) within the grace period.
            advanceHashing(transfers)
            if verifier.hasOutcomes { placeVerifiedDownloads(transfers) }
            if active.isEmpty && claiming.isEmpty || monotonic >= deadline { stop(transfers) }
            return
        }
        if !sessionsLoaded { loadSessions() }
        if loadingAfter != nil { loadQueue() }
        if monotonic - lastNetworkCheck >= options.networkCheckInterval {
            lastNetworkCheck = monotonic
            if engine.refreshDetectedNetwork() { policyReviewNeeded = true }
        }
        if policyReviewNeeded || budgetExceeded || clock.now() >= nextPolicyEdge { reevaluatePolicy(transfers) }
        fireTimersIfDue(monotonic)
        forgetSpentSignatures(monotonic)
        if orphansPossible { requeueOrphans() }
        if cleanupsDue { startCleanups(transfers) }
        if scheduleNeeded { schedule() }
        advanceHashing(transfers)
        if verifier.hasOutcomes { placeVerifiedDownloads(transfers) }
        if bandwidthDirty { applyBandwidth() }
    }

    func finished(_ easy: EasyHandle, _ code: CurlCode, _ transfers: CurlTransfers) {
        curl = transfers
        store.holdWrites()
        if !signerCalls.isEmpty, let call = signerCalls.removeValue(forKey: ObjectIdentifier(easy)) {
            finishedSigner(call, code: code)
        } else if let cleanup = cleanups.removeValue(forKey: ObjectIdentifier(easy)) {
            finishedCleanup(cleanup, code: code)
        } else if let transfer = byHandle[ObjectIdentifier(easy)] {
            finished(transfer, code: code, transfers)
        }
    }

    func afterPerform(_ transfers: CurlTransfers) {
        paceBackground()
        publishProgress(force: false)
        if sleepLimit != 0 { releaseWritesWhenDue() }
    }

    /// Hands the writes held so far to the store, unless `options.pacedTransfers` or more
    /// transfers are running, fewer than `options.pacedClaims` slots wait for their next task's
    /// claim, and the last went less than `options.writePacing` ago: then they wait for the next
    /// turns' (the worker sleeps no longer than that). Each commit costs the writer its pages of
    /// the WAL (about six for the tables and indexes every commit touches) and its transaction,
    /// and the engine a wake-up for the answers; a claim held back keeps its slot idle, which is
    /// why so few wait (with time alone, 2 ms, the CPU went down a tenth and the wall up 7 %).
    func releaseWritesWhenDue() {
        let monotonic = monotonicSeconds()
        if stopDeadline == nil, active.count >= options.pacedTransfers, claiming.count < options.pacedClaims,
            monotonic - writesReleasedAt < options.writePacing
        {
            return
        }
        if store.releaseWrites() { writesReleasedAt = monotonic }
    }

    var sleepLimit: Double? {
        if !hashing.isEmpty
            || scheduleNeeded && active.count + claiming.count < options.maxConcurrentTransfers && scheduler.queuedCount > 0
        {
            return 0
        }
        var limit = options.tick
        if store.holdsWrites { limit = min(limit, max(0, writesReleasedAt + options.writePacing - monotonicSeconds())) }
        if let nextTimer { limit = min(limit, max(0, nextTimer - clock.now())) }
        if let untilWatchdog { limit = min(limit, untilWatchdog) }
        if stopDeadline != nil { limit = min(limit, 0.1) }
        if backgroundRunning { limit = min(limit, 0.02) }
        return limit
    }

    // MARK: What the store said

    /// One commit's changes: the queue, transfers whose task moved on, timers, sessions, settings.
    func take(_ changes: StoreChanges) {
        for task in changes.created where createdCopies.count < Self.createdCopiesLimit {
            createdCopies[task.sequence] = task
        }
        for sequence in changes.touched { createdCopies[sequence] = nil }
        for sequence in changes.unqueued {
            scheduler.dequeue(sequence)
            createdCopies[sequence] = nil
        }
        for entry in changes.queued where !claiming.contains(entry.sequence) {
            scheduler.enqueue(entry)
            scheduleNeeded = true
        }
        for id in changes.leftRunning { stopTransfer(id) }
        if let timer = changes.earliestTimer { nextTimer = min(nextTimer ?? timer, timer) }
        if changes.cleanupsAdded { cleanupsDue = true }
        if changes.queueReload { loadingAfter = 0 }
        if changes.policyReview { policyReviewNeeded = true }
        if !changes.sessions.isEmpty || changes.queueReload {
            sessionsLoaded = false
            policyReviewNeeded = true
        }
        if !changes.settings.isEmpty || changes.queueReload {
            policyReviewNeeded = true
            bandwidthDirty = true
        }
    }

    /// The task left `running` without the engine (a client's cancel or suspend, a session
    /// disabled, the resource timeout): its transfer stops, and its attempt is listed as stopped.
    func stopTransfer(_ id: String) {
        guard let transfer = active[id] else { return }
        logger.info("stopping a transfer: its task left running", metadata: ["task.id": "\(id)"])
        stop(transfer)
    }

    /// Ends a transfer without deciding the task's fate (the store or another node has it): its
    /// attempt is listed as stopped.
    func stop(_ transfer: Transfer) {
        let entry = history(of: transfer)
        release(transfer)
        store.recordStoppedAttempt(sequence: transfer.task.sequence, entry)
    }

    /// The queue as stored, in pages of 50,000 per turn so a deep queue does not hold the loop.
    func loadQueue() {
        guard let after = loadingAfter else { return }
        do {
            let page = try store.queuedEntries(after: after, limit: 50_000)
            for entry in page
            where !claiming.contains(entry.sequence) && active.values.allSatisfy({ $0.task.sequence != entry.sequence }) {
                scheduler.enqueue(entry)
            }
            loadingAfter = page.count < 50_000 ? nil : page.last?.sequence
            scheduleNeeded = true
        } catch {
            fault(.storeRead, "cannot read the queue; trying again", ["error": "\(error)"])
        }
    }

    func loadSessions() {
        do {
            sessionConfigurations = try store.sessionConfigurations()
            for (id, configuration) in sessionConfigurations {
                scheduler.setLimit(session: id, configuration.maxConnectionsPerHost)
            }
            sessionsLoaded = true
            scheduleNeeded = true
        } catch {
            fault(.storeRead, "cannot read the sessions; trying again", ["error": "\(error)"])
        }
    }

    // MARK: Timers

    /// Retries due, scheduled starts, resource deadlines: the store moves them (one write at a
    /// time in flight), at the earliest timer it knows of and at least every tick.
    func fireTimersIfDue(_ monotonic: Double) {
        let now = clock.now()
        guard !timersInFlight, (nextTimer.map { now >= $0 } ?? false) || monotonic - lastTimerCheck >= options.tick else {
            return
        }
        lastTimerCheck = monotonic
        timersInFlight = true
        cleanupsDue = true
        store.fireTimers(now: now) { [inbox = engine.inbox] result in inbox.post { loop in loop.timersFired(result) } }
    }

    func timersFired(_ result: Result<(expired: Int, next: Timestamp?), StoreError>) {
        timersInFlight = false
        switch result {
        case .success(let (expired, next)):
            nextTimer = next
            if expired > 0 { logger.info("tasks reached their resource timeout", metadata: ["tasks.count": "\(expired)"]) }
        case .failure(let error):
            fault(.storeWrite, "cannot fire timers", ["error": "\(error)"])
        }
    }

    // MARK: Faults and the end

    /// Something the engine could not do that must not pass silently: logged as an error and
    /// counted in `/metrics` (`backhaul_engine_faults_total`).
    func fault(_ kind: EngineMetrics.Fault, _ message: Logger.Message, _ metadata: Logger.Metadata = [:]) {
        metrics.faults[kind.rawValue, default: 0] += 1
        logger.error(message, metadata: metadata)
    }

    /// Tasks the store shows running without a transfer here (their end could not be written)
    /// go back to the queue, so they run again instead of staying `running` until a restart.
    func requeueOrphans() {
        orphansPossible = false
        store.requeueRunning(except: Set(active.keys)) { [inbox = engine.inbox] result in
            inbox.post { loop in
                switch result {
                case .success(let count) where count > 0:
                    loop.logger.warning(
                        "tasks shown running without a transfer went back to the queue", metadata: ["count": "\(count)"])
                case .success: break
                case .failure(let error):
                    loop.fault(.storeWrite, "cannot requeue tasks", ["error": "\(error)"])
                    loop.orphansPossible = true
                }
            }
        }
    }

    /// Shutdown: every running transfer goes back to the queue without counting its attempt.
    func stop(_ transfers: CurlTransfers) {
        for transfer in Array(active.values) {
            release(transfer)
            record(transfer, .interrupted)
        }
        for cleanup in cleanups.values { transfers.remove(cleanup.easy) }
        cleanups.removeAll()
        for call in signerCalls.values { transfers.remove(call.easy) }
        signerCalls.removeAll()
        signatures.removeAll()
        spareHandles.removeAll()
        publishProgress(force: true)
        verifier.stop()
        // Before the engine is seen stopped (and the store closed behind it), not at the turn's end.
        store.releaseWrites()
        isDone = true
        engine.shared.withLockNotifyingAll { $0.stopped = true }
        logger.info("engine stopped")
    }
}
