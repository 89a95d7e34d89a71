import BackhaulCore
import BackhaulFiles
import Threads
import BackhaulStore
import CCurl
import Curl
import Glibc
import JSON
import Logging

/// Tunables of the engine (from the daemon's configuration).
public struct EngineOptions: Sendable {
    /// Transfers running at once, over all sessions and hosts.
    public var maxConcurrentTransfers = 16
    public var uploadBufferSize = 512 * 1024
    public var userAgent = "backhauld/\(BackhaulVersion.string)"
    public var caBundle: String?
    /// How often the engine looks at timers when nothing wakes it (seconds).
    public var tick: Double = 1
    /// At most one `task.progress` event (and progress write) per running task this often (seconds).
    public var progressInterval: Double = 5
    /// The routing table the network is detected from, and how often it is read (seconds).
    public var routeFile = "/proc/net/route"
    public var networkCheckInterval: Double = 1
    public var classifier = NetworkClassifier()
    /// The service policy of the config file (`PUT /v1/policy` replaces it at run time).
    public var policy = ServicePolicy()
    /// Refuse to send to a peer whose address is not public, checked once connected.
    public var denyPrivateDestinations = false

    public init() {}
}

/// What the engine counts, for `/metrics` (counters since the daemon started).
public struct EngineMetrics: Sendable, Equatable {
    public var running = 0
    /// Request body bytes sent, by the network type they went over.
    public var bytesSentByNetwork: [NetworkType: Int64] = [:]
    public var bytesReceivedByNetwork: [NetworkType: Int64] = [:]
    /// Running transfers the policy stopped, by the waiting reason (or `failed`).
    public var policyStops: [String: Int] = [:]
    /// Attempts that failed and were retried, by kind of failure (one of `retryReasons`).
    public var retries: [String: Int] = [:]
    /// Kinds of retried failures, a closed set for metric labels.
    public static let retryReasons = ["http_408", "http_425", "http_429", "http_5xx", "timed_out", "cannot_connect", "cannot_find_host",
                                      "connection_lost", "checksum_mismatch", "other"]
    /// The bandwidth limit in force (bytes/s), nil when there is none.
    public var bandwidthLimit: Int64?
    /// What is left today of each discretionary budget.
    public var budgetRemaining: [NetworkType: Int64] = [:]
    /// Things the engine could not do and logged as errors, by kind (one of `Fault`).
    public var faults: [String: Int] = [:]

    /// Kinds of engine faults, a closed set for metric labels.
    public enum Fault: String, Sendable, CaseIterable {
        /// A read of the store failed (the work it was for is tried again on the next turn).
        case storeRead = "store_read"
        /// A write of the store failed.
        case storeWrite = "store_write"
        /// A task's own configuration could not be applied over its session's (the task failed).
        case invalidConfiguration = "invalid_configuration"
        /// A stored record could not be read back.
        case corruptRecord = "corrupt_record"
        /// curl refused an option.
        case curl
    }

    public init() {}
}

public enum BackhaulVersion {
    public static let string = "0.1.0"
}

/// The transfer engine: one thread owns the curl multi handle and every easy handle, loops on
/// `curl_multi_poll`, and is woken by `curl_multi_wakeup` when the API changed the store.
public final class Engine: Sendable {
    struct Shared {
        var wakeRequested = true
        var stopDeadline: Double?
        var stopped = false
        var live: [String: LiveProgress] = [:]
        var saturated: Set<String> = []
        /// Decide again for held and running tasks (network, policy or configuration changed).
        var reevaluate = true
        var detected = NetworkState.disconnected
        var networkOverride: NetworkState?
        var policy = ServicePolicy()
        var metrics = EngineMetrics()
    }

    let store: Store
    let logger: Logger
    let options: EngineOptions
    private let clock: any Clock
    let shared = Locked(Shared())
    private let thread = WorkerThread()
    private let waker: MultiWaker
    /// Created here, then used only by the engine thread (and freed after it is joined).
    private nonisolated(unsafe) let multi: MultiHandle
    private nonisolated(unsafe) var loop: EngineLoop?

    public init(store: Store, logger: Logger, options: EngineOptions = EngineOptions(), clock: any Clock = SystemClock()) throws {
        self.store = store
        self.logger = logger
        self.options = options
        self.clock = clock
        multi = try MultiHandle()
        waker = multi.waker
        // A stored override or policy that cannot be read refuses the start: running without it
        // could send over a network the operator had ruled out.
        let override: NetworkState?
        let policy: ServicePolicy
        do {
            override = try store.setting(Self.networkOverrideKey).map { try NetworkState.decodeOverride($0, classifier: options.classifier) }
            policy = try store.setting(Self.policyKey).map { try options.policy.applying($0) } ?? options.policy
        } catch {
            throw StoreError.corrupt("the stored network override or run-time policy cannot be read (\(error)); to drop both, "
                                     + "run: sqlite3 STATE_DIR/backhaul.db \"DELETE FROM settings WHERE key IN ('network_override', 'policy')\"")
        }
        let detected = Self.detect(options)
        shared.withLock {
            $0.networkOverride = override
            $0.policy = policy
            $0.detected = detected
        }
    }

    /// Puts interrupted tasks back in the queue and starts the engine thread.
    public func start() throws {
        let recovered = try store.recoverInterrupted()
        if recovered > 0 { logger.info("re-queued tasks interrupted by the last stop", metadata: ["tasks.count": "\(recovered)"]) }
        if !policy.transfersEnabled { try cancelAllForDisabledTransfers() }
        loop = EngineLoop(engine: self, multi: multi)
        thread.start { [self] in loop!.run() }
    }

    /// Something changed in the store (tasks, sessions, commands): look again. `policy`: a
    /// configuration changed, so held and running tasks are decided again.
    public func wake(policy: Bool = false) {
        shared.withLock {
            $0.wakeRequested = true
            if policy { $0.reevaluate = true }
        }
        waker.wake()
    }

    /// Stops starting transfers, lets running ones finish within `grace` seconds, puts the rest
    /// back in the queue (their attempt not counted), and joins the thread.
    public func shutdown(grace: Double) {
        shared.withLock { $0.stopDeadline = monotonicSeconds() + grace }
        waker.wake()
        thread.join()
    }

    public var isRunning: Bool { shared.withLock { $0.stopDeadline == nil && !$0.stopped } }

    /// Live figures of a running task.
    public func liveProgress(taskID: String) -> LiveProgress? { shared.withLock { $0.live[taskID] } }

    /// Whether queued tasks of this session and host are held by `max_connections_per_host`.
    public func isHostSaturated(sessionID: String, hostKey: String) -> Bool {
        shared.withLock { $0.saturated.contains(sessionID + " " + hostKey) }
    }

    // MARK: For the loop

    fileprivate func takeWake() -> (wake: Bool, stopDeadline: Double?, reevaluate: Bool) {
        shared.withLock { state in
            defer {
                state.wakeRequested = false
                state.reevaluate = false
            }
            return (state.wakeRequested, state.stopDeadline, state.reevaluate)
        }
    }

    fileprivate func publish(live: [String: LiveProgress], saturated: Set<String>, metrics: EngineMetrics) {
        shared.withLock {
            $0.live = live
            $0.saturated = saturated
            $0.metrics = metrics
        }
    }

    /// Counters and gauges of the engine for `/metrics`.
    public var metrics: EngineMetrics { shared.withLock { $0.metrics } }

    fileprivate func takeReevaluate() -> Bool {
        shared.withLock { state in
            defer { state.reevaluate = false }
            return state.reevaluate
        }
    }

    fileprivate func markStopped() { shared.withLock { $0.stopped = true } }

    fileprivate var context: (store: Store, logger: Logger, options: EngineOptions, clock: any Clock) {
        (store, logger, options, clock)
    }
}

/// The engine thread's state: everything here is touched by that thread only.
final class EngineLoop {
    unowned let engine: Engine
    let multi: MultiHandle
    let store: Store
    var logger: Logger
    let options: EngineOptions
    let clock: any Clock

    /// Requests that release a cancelled task's server side (tus `DELETE`), beside the transfers.
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

    var cleanups: [ObjectIdentifier: Cleanup] = [:]
    /// Syncs and checks finished downloads on a thread of its own.
    let verifier: DownloadVerifier
    static let maxCleanupAttempts = 5

    var active: [String: Transfer] = [:]
    var byHandle: [ObjectIdentifier: Transfer] = [:]
    // Policy state (see the Policy extension below).
    var lastNetworkCheck = 0.0
    var network = NetworkState.disconnected
    var policy = ServicePolicy()
    var nextPolicyEdge: Timestamp = 0
    var budgetDay = ""
    var budgetUsed: [NetworkType: Int64] = [:]
    var budgetPending: [NetworkType: Int64] = [:]
    var lastBudgetFlush = 0.0
    var budgetExceeded = false
    var bandwidthDirty = true
    var sendSpeedShare: Int64 = 0
    var metrics = EngineMetrics()
    /// `auto`'s picks by session and host (`Transfer.limitKey`), for the daemon's run (see
    /// EngineLoop+Resumable.swift).
    var protocolSelections: [String: (choice: ProtocolSelection.Choice, at: Double)] = [:]
    /// Transfers whose next request waits for its body's digest (see `advanceHashing`).
    var hashing: [String: Transfer] = [:]
    static let hashBudget = 8 << 20
    let hashBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
    var perKey: [String: Int] = [:]
    /// The connection limit of each key with transfers running.
    var perKeyLimit: [String: Int] = [:]
    var saturatedKeys: Set<String> = []
    /// Keys outside which the queue was last found empty, and the store's queue version then.
    var emptyOutside: (keys: Set<String>, version: Int)?
    /// Something may have made a queued task runnable: a wake, a timer, a freed slot.
    var scheduleNeeded = true
    var sessionConfigurations: [String: TransferConfiguration?] = [:]
    var nextTimer: Timestamp?
    var lastPublish = 0.0
    /// Files of completed tasks to delete once their completion is committed.
    var pendingDeletes: [String] = []
    /// A write that ends an attempt failed: the store may show tasks running that are not.
    var orphansPossible = false
    /// The last reconcile could not read the store: do it again.
    var reconcileNeeded = false

    init(engine: Engine, multi: MultiHandle) {
        self.engine = engine
        self.multi = multi
        (store, logger, options, clock) = engine.context
        let waker = multi.waker
        verifier = DownloadVerifier { waker.wake() }
    }

    deinit { hashBuffer.deallocate() }

    func run() {
        logger.info("engine started", metadata: ["engine.max_concurrent_transfers": "\(options.maxConcurrentTransfers)"])
        verifier.start()
        defer { verifier.stop() }
        var lastTimerCheck = 0.0
        while true {
            var (wake, stopDeadline, reevaluate) = engine.takeWake()
            let monotonic = monotonicSeconds()
            if let stopDeadline, active.isEmpty || monotonic >= stopDeadline {
                interruptAll()
                break
            }
            if monotonic - lastNetworkCheck >= options.networkCheckInterval {
                lastNetworkCheck = monotonic
                engine.refreshNetwork()
                if engine.takeReevaluate() { reevaluate = true }
            }
            if reevaluate || budgetExceeded || clock.now() >= nextPolicyEdge {
                if stopDeadline == nil { reevaluatePolicy() }
            }
            var changed = wake
            if wake {
                sessionConfigurations.removeAll(keepingCapacity: true)
                scheduleNeeded = true
            }
            let now = clock.now()
            if wake || (nextTimer.map { now >= $0 } ?? false) || monotonic - lastTimerCheck >= options.tick {
                lastTimerCheck = monotonic
                scheduleNeeded = true
                do {
                    let expired = try store.fireTimers(now: now)
                    if !expired.isEmpty { changed = true }
                    nextTimer = try store.nextTimer()
                } catch {
                    logger.error("cannot read timers", metadata: ["error": "\(error)"])
                }
            }
            if changed || reconcileNeeded { reconcile() }
            if orphansPossible { requeueOrphans() }
            if stopDeadline == nil {
                if scheduleNeeded { startCleanups(now: now) }
                batched { schedule() }
            }
            advanceHashing()
            do {
                try multi.perform()
            } catch {
                logger.error("curl_multi_perform failed", metadata: ["error": "\(error)"])
            }
            var freedSlots = false
            let completed = multi.completed()
            if !completed.isEmpty {
                batched {
                    for (easy, code) in completed {
                        if let cleanup = cleanups.removeValue(forKey: ObjectIdentifier(easy)) {
                            finishedCleanup(cleanup, code: code)
                            continue
                        }
                        guard let transfer = byHandle[ObjectIdentifier(easy)] else { continue }
                        finished(transfer, code: code)
                        freedSlots = true
                    }
                }
            }
            if verifier.hasOutcomes {
                batched { placeVerifiedDownloads() }
                freedSlots = true
            }
            publishProgress(force: false)
            // Slots came free: fill them now rather than after poll's timeout.
            if freedSlots && stopDeadline == nil { continue }
            var timeout = options.tick * 1000
            if let nextTimer { timeout = min(timeout, max(0, (nextTimer - clock.now()) * 1000)) }
            if stopDeadline != nil { timeout = min(timeout, 100) }
            if !hashing.isEmpty { timeout = 0 }
            if bandwidthDirty { applyBandwidth() }
            do {
                try multi.poll(timeoutMilliseconds: Int(timeout.rounded(.up)))
            } catch {
                logger.error("curl_multi_poll failed", metadata: ["error": "\(error)"])
            }
        }
        publishProgress(force: true)
        engine.markStopped()
        logger.info("engine stopped")
    }

    // MARK: Scheduling

    /// A task's configuration: its session's with its own overrides applied. Nil when the session
    /// cannot be read (logged); a failure when the overrides cannot be applied, which the caller
    /// must not paper over with the session's configuration (that would drop a restriction such
    /// as `allows_cellular_access: false`).
    func configuration(sessionID: String, overrides: JSONObject) -> Result<TransferConfiguration, ValidationError>? {
        let sessionConfiguration: TransferConfiguration?
        if let cached = sessionConfigurations[sessionID] {
            sessionConfiguration = cached
        } else {
            do {
                sessionConfiguration = try store.session(id: sessionID)?.0.configuration
            } catch {
                fault(.storeRead, "cannot read a session's configuration", ["session.id": "\(sessionID)", "error": "\(error)"])
                return nil
            }
            sessionConfigurations[sessionID] = sessionConfiguration
        }
        guard let sessionConfiguration else { return nil }
        guard !overrides.isEmpty else { return .success(sessionConfiguration) }
        return Result { () throws(ValidationError) in try sessionConfiguration.applying(.object(overrides)) }
    }

    /// A task whose own configuration cannot be applied fails, saying why, instead of running
    /// with less than it asked for.
    func failForConfiguration(_ id: String, _ error: ValidationError) {
        fault(.invalidConfiguration, "a task's configuration cannot be applied; the task fails", ["task.id": "\(id)", "error": "\(error)"])
        let failure = TaskError(.unknown, message: "the task's configuration cannot be applied over its session's: \(error.description)")
        do {
            try store.applyPolicy(id: id, .fail(failure))
        } catch {
            logger.error("cannot fail a task", metadata: ["task.id": "\(id)", "error": "\(error)"])
        }
    }

    /// Something the engine could not do that must not pass silently: logged as an error and
    /// counted in `/metrics` (`backhaul_engine_faults_total`).
    func fault(_ kind: EngineMetrics.Fault, _ message: Logger.Message, _ metadata: Logger.Metadata = [:]) {
        metrics.faults[kind.rawValue, default: 0] += 1
        logger.error(message, metadata: metadata)
    }

    /// Starts queued tasks into free slots, in run order, honouring per-host limits. Each query
    /// leaves out the keys already at their limit; every round starts a task, saturates a key, or
    /// ends the scan.
    func schedule() {
        guard scheduleNeeded else { return }
        scheduleNeeded = false
        var free = options.maxConcurrentTransfers - active.count
        guard free > 0 else { return }
        var saturated = Set(perKey.filter { key, count in count >= (perKeyLimit[key] ?? Int.max) }.keys)
        for _ in 0..<64 where free > 0 {
            // Finding that nothing is queued outside the saturated keys costs a scan of the queue;
            // it stays true until a task enters the queue (or the set of keys shrinks).
            let version = store.queueVersion
            if let known = emptyOutside, known.version == version, saturated.isSuperset(of: known.keys) { break }
            let page: [QueueEntry]
            do {
                page = try store.queuedTasks(excluding: saturated, limit: free)
            } catch {
                logger.error("cannot read the queue", metadata: ["error": "\(error)"])
                return
            }
            if page.isEmpty { emptyOutside = (saturated, version) }
            var changed = false
            let context = policyContext()
            for entry in page where free > 0 {
                let key = entry.sessionID + " " + entry.hostKey
                guard !saturated.contains(key),
                    let merged = configuration(sessionID: entry.sessionID, overrides: entry.configurationOverrides)
                else { continue }
                let configuration: TransferConfiguration
                switch merged {
                case .success(let value): configuration = value
                case .failure(let error):
                    failForConfiguration(entry.id, error)
                    changed = true
                    continue
                }
                let decision = Policy.decide(configuration, in: context)
                if decision != .run {
                    // The network or the policy holds it (or ends it): out of the queue.
                    do { try store.applyPolicy(id: entry.id, decision) } catch {
                        logger.error("cannot hold a task", metadata: ["task.id": "\(entry.id)", "error": "\(error)"])
                    }
                    changed = true
                    continue
                }
                if perKey[key, default: 0] < configuration.maxConnectionsPerHost,
                    begin(entry.id, configuration: configuration, key: key)
                {
                    free -= 1
                    changed = true
                }
                if perKey[key, default: 0] >= configuration.maxConnectionsPerHost {
                    saturated.insert(key)
                    changed = true
                }
            }
            if page.isEmpty || !changed { break }
        }
        saturatedKeys = saturated
    }

    /// Starts one attempt; false when the task could not start (it was failed or moved on).
    func begin(_ id: String, configuration: TransferConfiguration, key: String) -> Bool {
        var task: TaskRecord
        do {
            guard let started = try store.startAttempt(id: id) else { return false }
            task = started
        } catch {
            logger.error("cannot start a task", metadata: ["task.id": "\(id)", "error": "\(error)"])
            return false
        }
        var taskLogger = logger
        taskLogger[metadataKey: "task.id"] = "\(task.id)"
        var file: OpenedFile?
        var part: PartFile?
        let opened = task.download.map { spec in PartFile.open(spec.partPath).map { part = $0 } }
            ?? OpenedFile.open(task.file).map { file = $0 }
        if case .failure(let error) = opened {
            taskLogger.warning("the file cannot be opened", metadata: ["error.name": "\(error.name)"])
            record(task.id, attempt: task.attempts, bytesSent: 0, .failed(error, nil))
            return false
        }
        if let part, let offset = task.checkpoint?.offset, offset > 0, part.size < offset {
            // The `.part` file lost bytes the checkpoint counts (removed or cut by hand): start over.
            taskLogger.warning("the .part file is shorter than its checkpoint; the download starts over")
            task.checkpoint = nil
        }
        let headers = HeaderRules.merged(configuration.defaultHeaders, task.request.headers)
        var machine = makeMachine(for: task, headers: headers, key: key)
        let transfer: Transfer
        do {
            let step = machine.start(now: clock.now())
            transfer = try Transfer(task: task, configuration: configuration, limitKey: key, machine: machine, file: file, part: part,
                                    startedAt: clock.now())
            watchInformational(transfer)
            guard case .send(let request) = step else {
                conclude(transfer, step: step)
                return false
            }
            try send(transfer, request)
        } catch {
            taskLogger.error("cannot start the transfer", metadata: ["error": "\(error)"])
            record(task.id, attempt: task.attempts, bytesSent: 0,
                   .failed(TaskError(.badServerResponse, message: "cannot start the transfer: \(error)"), nil))
            return false
        }
        active[task.id] = transfer
        bandwidthDirty = true
        perKey[key, default: 0] += 1
        perKeyLimit[key] = configuration.maxConnectionsPerHost
        taskLogger.debug("attempt started", metadata: ["task.attempt": "\(task.attempts)", "upload.protocol": "\(task.upload.protocolName.rawValue)"])
        return true
    }

    // MARK: Completion

    func finished(_ transfer: Transfer, code: CurlCode) {
        let now = clock.now()
        let step: UploadStep
        if transfer.idleTimedOut {
            let seconds = transfer.configuration.timeoutIntervalForRequest
            step = .failed(.transport(.timedOut, message: "no bytes moved for \(seconds) s (timeout_interval_for_request)"))
        } else if transfer.destinationRefused {
            step = .failed(.fatal(TaskError(.cannotConnectToHost,
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
            persistCheckpoint(transfer)
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

    /// Hands a request to curl, or first to the hasher when it carries a digest header.
    func send(_ transfer: Transfer, _ request: PlannedRequest) throws {
        if transfer.startHashingIfNeeded(request) {
            hashing[transfer.task.id] = transfer
            return
        }
        try transfer.prepare(request, options: options)
        try multi.add(transfer.easy)
        byHandle[ObjectIdentifier(transfer.easy)] = transfer
    }

    /// Hashes the bodies of waiting requests, at most `hashBudget` bytes per loop turn so that
    /// running transfers are not starved; a request whose digest is done goes to curl.
    func advanceHashing() {
        var budget = Self.hashBudget
        for (id, transfer) in hashing where budget > 0 {
            let slice = budget / max(1, hashing.count)
            budget -= slice
            do {
                guard let request = try transfer.hashSlice(budget: max(slice, 1 << 20), buffer: hashBuffer) else { continue }
                hashing[id] = nil
                try send(transfer, request)
            } catch is Transfer.FileChanged {
                hashing[id] = nil
                conclude(transfer, step: .failed(.fatal(TaskError(.fileChanged, message: "the file changed while it was being read"))))
            } catch {
                hashing[id] = nil
                conclude(transfer, step: .failed(.transport(.other, message: "cannot continue: \(error)")))
            }
        }
    }

    /// A resumable upload's acknowledged offset is saved as it grows, so a crash or a retry
    /// resumes from there.
    func persistCheckpoint(_ transfer: Transfer) {
        guard var checkpoint = transfer.machine.checkpoint, !checkpoint.samePlace(as: transfer.checkpoint) else { return }
        checkpoint.attempt = checkpoint.offset > transfer.checkpoint.offset ? transfer.attempt : transfer.checkpoint.attempt
        transfer.checkpoint = checkpoint
        do {
            try store.saveCheckpoint(id: transfer.task.id, attempt: transfer.attempt, transfer.checkpoint)
        } catch {
            logger.warning("cannot save a checkpoint", metadata: ["task.id": "\(transfer.task.id)", "error": "\(error)"])
        }
    }

    /// Writes the end of an attempt and frees its slot. A download whose body is complete is first
    /// made durable and verified by the `DownloadVerifier`, holding its slot meanwhile.
    func conclude(_ transfer: Transfer, step: UploadStep) {
        if case .completed = step, let part = transfer.part, let spec = transfer.task.download, !transfer.verifying {
            transfer.verifying = true
            verifier.submit(DownloadVerifier.Job(taskID: transfer.task.id, attempt: transfer.attempt, part: part,
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
            if let changed = transfer.file?.checkUnchanged() {
                record(transfer, bytesSent: bytes, .failed(changed, response))
                return
            }
            if record(transfer, bytesSent: bytes, .completed(response)), task.deleteFileOnSuccess {
                pendingDeletes.append(task.file.path)
            }
        case .failed(let failure):
            let decision = RetryPlanner.decide(failure, attempts: transfer.failuresSinceProgress, policy: transfer.configuration.retry,
                                               now: clock.now(), deadline: task.deadlineAt, random: RandomID.unit)
            switch decision {
            case .retry(let at):
                metrics.retries[Self.retryReason(failure), default: 0] += 1
                logger.info("attempt failed, will retry", metadata: [
                    "task.id": "\(task.id)", "task.attempt": "\(transfer.attempt)", "retry.at": "\(RFC3339.format(at))",
                    "failure": "\(failure)",
                ])
                record(transfer, bytesSent: bytes, .retry(at: at, failure.error, response))
                nextTimer = min(nextTimer ?? at, at)
            case .fail(let error):
                logger.info("task failed", metadata: ["task.id": "\(task.id)", "error.code": "\(error.code)", "error.name": "\(error.name)"])
                record(transfer, bytesSent: bytes, .failed(error, response))
            case .authenticationRequired:
                record(transfer, bytesSent: bytes, .authenticationRequired(response))
            }
        }
    }

    /// Writes how a transfer's attempt ended, with its entry in the task's attempt history.
    /// `bytesSent` defaults to what the server acknowledged.
    @discardableResult
    func record(_ transfer: Transfer, bytesSent: Int64? = nil, _ result: AttemptResult) -> Bool {
        record(transfer.task.id, attempt: transfer.attempt, bytesSent: bytesSent ?? transfer.machine.bytesAcknowledged, result,
               history: history(of: transfer))
    }

    /// Writes how attempt `attempt` ended; without `history`, as one that ended as it began (it
    /// could not start).
    @discardableResult
    func record(_ id: String, attempt: Int, bytesSent: Int64, _ result: AttemptResult, history: AttemptRecord? = nil) -> Bool {
        let now = clock.now()
        let entry = history ?? AttemptRecord(startedAt: now, endedAt: now, bytesSent: 0, bytesReceived: 0, outcome: result.outcome,
                                             networkType: network.type)
        do {
            return try store.finishAttempt(id: id, attempt: attempt, bytesSent: bytesSent, result: result, record: entry) != nil
        } catch {
            fault(.storeWrite, "cannot record the end of an attempt", ["task.id": "\(id)", "error": "\(error)"])
            orphansPossible = true
            return false
        }
    }

    /// A transfer's attempt as its history shows it (the outcome is filled in when it is written).
    func history(of transfer: Transfer) -> AttemptRecord {
        let moved = max(transfer.bytesSent, transfer.bytesBeforeRequest + transfer.easy.bytesUploaded)
        let status = transfer.response.status
        return AttemptRecord(
            startedAt: transfer.startedAt, endedAt: clock.now(), bytesSent: transfer.part == nil ? moved : 0,
            bytesReceived: transfer.part == nil ? 0 : moved, outcome: .stopped, httpStatus: status == 0 ? nil : status,
            networkType: network.type)
    }

    /// Runs `body` with the store writes it makes committed as one transaction (`Store.batch`):
    /// a loop turn that starts or ends many attempts pays for one commit. What must follow the
    /// commit (deleting a completed task's file) runs after it; if the commit fails, none of it
    /// happened, and the tasks it would have ended go back to the queue.
    func batched(_ body: () -> Void) {
        do {
            try store.batch(body)
        } catch {
            logger.error("cannot commit the engine's writes", metadata: ["error": "\(error)"])
            pendingDeletes.removeAll()
            orphansPossible = true
            return
        }
        for path in pendingDeletes { unlink(path) }
        pendingDeletes.removeAll()
    }

    /// Tasks the store shows running without a transfer here (their end could not be written)
    /// go back to the queue, so they run again instead of staying `running` until a restart.
    func requeueOrphans() {
        do {
            let count = try store.requeueRunning(except: Set(active.keys))
            orphansPossible = false
            if count > 0 {
                logger.warning("tasks shown running without a transfer went back to the queue", metadata: ["count": "\(count)"])
                scheduleNeeded = true
            }
        } catch {
            logger.error("cannot requeue tasks", metadata: ["error": "\(error)"])
        }
    }

    /// Downloads the verifier is done with: a task still in that attempt is renamed into place
    /// and completes, or fails with the verifier's error. One whose task moved on meanwhile
    /// (cancelled, say) is left alone: the store removes its `.part` file.
    func placeVerifiedDownloads() {
        for outcome in verifier.take() {
            guard let transfer = active[outcome.taskID], transfer.attempt == outcome.attempt, transfer.verifying,
                let part = transfer.part, let spec = transfer.task.download else { continue }
            let error = outcome.error ?? part.place(at: spec.destination, overwrite: spec.overwrite)
            release(transfer)
            let bytes = transfer.machine.bytesAcknowledged
            if let error {
                logger.info("download failed", metadata: ["task.id": "\(outcome.taskID)", "error.name": "\(error.name)"])
                record(transfer, bytesSent: bytes, .failed(error, transfer.responseRecord))
            } else {
                record(transfer, bytesSent: bytes, .completed(transfer.responseRecord))
            }
        }
    }

    /// The disk cannot hold the download: the task is cancelled with reason 2 (the store removes
    /// its `.part` file, as for every download that ends without completing).
    func cancelForLackOfSpace(_ transfer: Transfer) {
        release(transfer)
        logger.warning("not enough disk space for a download", metadata: ["task.id": "\(transfer.task.id)"])
        let total = transfer.withDownload { $0.total } ?? nil
        record(transfer, bytesSent: 0, .cancelled(.insufficientSystemResources,
                          "cancelled: the disk cannot hold the download" + (total.map { " (\($0) bytes)" } ?? "")))
    }

    func release(_ transfer: Transfer) {
        guard active[transfer.task.id] === transfer else { return }
        // A download's received bytes are made durable and checkpointed before it stops, so the
        // next attempt asks only for the rest.
        if transfer.part != nil, !transfer.insufficientSpace, !transfer.verifying, transfer.syncPart() { persistCheckpoint(transfer) }
        // Bytes a short transfer sent between two progress rounds still count.
        countSent(transfer, bytes: max(transfer.bytesSent, transfer.bytesBeforeRequest + transfer.easy.bytesUploaded))
        if transfer.configuration.discretionary { flushBudget(force: true) }
        multi.remove(transfer.easy)
        hashing[transfer.task.id] = nil
        active[transfer.task.id] = nil
        bandwidthDirty = true
        byHandle[ObjectIdentifier(transfer.easy)] = nil
        perKey[transfer.limitKey, default: 1] -= 1
        if perKey[transfer.limitKey] == 0 {
            perKey[transfer.limitKey] = nil
            perKeyLimit[transfer.limitKey] = nil
        }
        scheduleNeeded = true
    }

    func startCleanups(now: Timestamp) {
        guard cleanups.count < 4 else { return }
        let due: [Store.DueCleanup]
        do {
            due = try store.dueCleanups(now: now, limit: 4 - cleanups.count, excluding: Set(cleanups.values.map(\.sequence)))
        } catch {
            fault(.storeRead, "cannot read cleanups", ["error": "\(error)"])
            return
        }
        for (sequence, read, attempts) in due {
            let plan: CleanupPlan
            switch read {
            case .success(let value): plan = value
            case .failure(let error):
                // A row nobody can read would otherwise be skipped, and kept, forever.
                fault(.corruptRecord, "dropping a cleanup that cannot be read", ["cleanup.seq": "\(sequence)", "error": "\(error)"])
                do { try store.recordCleanup(sequence: sequence, retryAt: nil) } catch {
                    fault(.storeWrite, "cannot drop a cleanup", ["error": "\(error)"])
                }
                continue
            }
            do {
                let cleanup = try Cleanup(sequence: sequence, attempts: attempts, plan: plan)
                let request = plan.request
                try cleanup.easy.set(CURLOPT_URL, request.url)
                try cleanup.easy.set(CURLOPT_NOSIGNAL, 1)
                try cleanup.easy.set(CURLOPT_PROTOCOLS_STR, "http,https")
                if request.method == "GET" {
                    try cleanup.easy.set(CURLOPT_HTTPGET, 1)
                } else {
                    try cleanup.easy.set(CURLOPT_CUSTOMREQUEST, request.method)
                }
                try cleanup.easy.set(CURLOPT_TIMEOUT, 30)
                if let bundle = options.caBundle { try cleanup.easy.set(CURLOPT_CAINFO, bundle) }
                if let signing = request.signing {
                    try cleanup.easy.set(CURLOPT_AWS_SIGV4, "aws:amz:\(signing.region):s3")
                    try cleanup.easy.set(CURLOPT_USERPWD, "\(signing.accessKeyID):\(signing.secretAccessKey)")
                }
                try cleanup.easy.setHeaders(request.headers.map { "\($0.0): \($0.1)" })
                try multi.add(cleanup.easy)
                cleanups[ObjectIdentifier(cleanup.easy)] = cleanup
            } catch {
                fault(.curl, "cannot start a cleanup request", ["error": "\(error)"])
            }
        }
    }

    /// 2xx, 404 and 410 end a cleanup (the server no longer holds the upload); other outcomes are
    /// retried a few times with backoff, then given up and logged. A listing that answered is
    /// replaced by the aborts of what it found.
    func finishedCleanup(_ cleanup: Cleanup, code: CurlCode) {
        let status = code == .ok ? cleanup.response.status : 0
        if (200..<300).contains(status), cleanup.plan.abortListedUploads != nil {
            let found = cleanup.plan.followUps(listing: cleanup.response.body)
            do {
                let aborts = try store.replaceCleanup(sequence: cleanup.sequence, with: found)
                logger.info("listed the multipart uploads of a cancelled task", metadata: [
                    "cleanup.found": "\(found.count)", "cleanup.aborts": "\(aborts)",
                ])
                if aborts > 0 { scheduleNeeded = true }
            } catch {
                fault(.storeWrite, "cannot record a cleanup", ["error": "\(error)"])
            }
            return
        }
        let done = (200..<300).contains(status) || status == 404 || status == 410
        var retryAt: Timestamp?
        if !done {
            if cleanup.attempts + 1 < Self.maxCleanupAttempts {
                retryAt = clock.now() + 5 * Double(1 << cleanup.attempts)
                nextTimer = min(nextTimer ?? retryAt!, retryAt!)
            } else {
                logger.warning("giving up releasing a cancelled upload at the server", metadata: [
                    "cleanup.status": "\(status)", "error": "\(code == .ok ? "" : code.message)",
                ])
            }
        }
        do { try store.recordCleanup(sequence: cleanup.sequence, retryAt: retryAt) } catch {
            fault(.storeWrite, "cannot record a cleanup", ["error": "\(error)"])
        }
    }

    /// Stops transfers whose task the API moved away from `running` (cancel, suspend, disable, expiry).
    func reconcile() {
        guard !active.isEmpty else { return }
        let states: [String: TaskState]
        do {
            states = try store.states(of: Array(active.keys))
        } catch {
            // Tried again next turn: a cancelled transfer must not keep running unnoticed.
            fault(.storeRead, "cannot read the states of running tasks", ["error": "\(error)"])
            reconcileNeeded = true
            return
        }
        reconcileNeeded = false
        for (id, transfer) in active where states[id] != .running {
            logger.info("stopping a transfer", metadata: ["task.id": "\(id)", "task.state": "\(states[id]?.rawValue ?? "deleted")"])
            let entry = history(of: transfer)
            release(transfer)
            do { try store.recordStoppedAttempt(id: id, entry) } catch {
                fault(.storeWrite, "cannot record a stopped attempt", ["task.id": "\(id)", "error": "\(error)"])
            }
        }
    }

    /// Shutdown: every running transfer goes back to the queue without counting its attempt.
    func interruptAll() {
        for transfer in Array(active.values) {
            release(transfer)
            record(transfer, .interrupted)
        }
    }

    func publishProgress(force: Bool) {
        let now = monotonicSeconds()
        guard force || now - lastPublish >= 0.25 else { return }
        lastPublish = now
        var live: [String: LiveProgress] = [:]
        for (id, transfer) in active {
            let bytes = transfer.bytesSent
            let elapsed = now - transfer.lastSample.time
            if elapsed >= 0.5 {
                let instant = Double(bytes - transfer.lastSample.bytes) / elapsed
                transfer.rate = transfer.rate == 0 ? instant : transfer.rate * 0.5 + instant * 0.5
                transfer.lastSample = (now, bytes)
            }
            countSent(transfer, bytes: bytes)
            // A download's checkpoint follows what is durable: fsync at most once a second (or
            // every 128 MiB), then save the offset.
            if transfer.part != nil, now - transfer.lastPartSync >= 1 || bytes - transfer.lastPartSyncOffset >= 128 << 20,
                transfer.syncPart()
            {
                persistCheckpoint(transfer)
            }
            let progress = LiveProgress(bytesSent: bytes, bytesPerSecond: transfer.rate)
            live[id] = progress
            if now - transfer.lastProgressEvent >= options.progressInterval, bytes != transfer.lastProgressBytes {
                transfer.lastProgressEvent = now
                transfer.lastProgressBytes = bytes
                do {
                    try store.recordProgress(id: id, attempt: transfer.attempt, bytesSent: transfer.machine.bytesAcknowledged,
                                             live: progress)
                } catch {
                    logger.warning("cannot record progress", metadata: ["task.id": "\(id)", "error": "\(error)"])
                }
            }
        }
        metrics.running = active.count
        metrics.bandwidthLimit = policy.bandwidth(minuteOfDay: LocalTime.components(of: clock.now()).minute, network: network.type)
        metrics.budgetRemaining = [:]
        for (type, budget) in policy.discretionaryDailyBudget { metrics.budgetRemaining[type] = max(0, budget - budgetUsed[type, default: 0]) }
        engine.publish(live: live, saturated: saturatedKeys.filter { perKey[$0] != nil }, metrics: metrics)
        flushBudget(force: force)
    }

    /// The label of a retried failure (one of `EngineMetrics.retryReasons`).
    static func retryReason(_ failure: AttemptFailure) -> String {
        switch failure {
        case .http(let status, _) where [408, 425, 429].contains(status): return "http_\(status)"
        case .http(let status, _) where status >= 500: return "http_5xx"
        case .checksumMismatch: return "checksum_mismatch"
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
