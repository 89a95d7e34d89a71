import BackhaulCore
import BackhaulFiles
import BackhaulQueue
import Curl
import Logging
import Systemd
import Threads

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
    /// Where the network comes from besides an override: NetworkManager on the system bus, the
    /// routing table, or NetworkManager whenever it is on the bus (`--network-source`).
    public var networkSource = NetworkSourceMode.routingTable
    /// Refuse to send to a peer whose address is not public, checked once connected.
    public var denyPrivateDestinations = false
    /// The upload allow-list: a server-given URL (a `Location`) outside it is not followed, and a
    /// cleanup is not sent there (docs/credentials.md).
    public var destinations = DestinationRules()
    /// The roots a task's file is walked beneath (docs/security.md, "Files by handle"): the
    /// daemon's allowed roots.
    public var allowedRoots = AllowedRoots(["/"])
    /// Where `s3` tasks without keys take theirs (docs/credentials.md); nil: nowhere, such a task fails its
    /// attempts.
    public var awsCredentials: AWSCredentialChain?
    /// While at least `pacedTransfers` transfers run, the engine's writes (attempts ended and
    /// started) wait for those of the next turns, together one commit, until `pacedClaims` slots
    /// wait for their next task's claim or `writePacing` seconds passed since the last went (see
    /// `EngineLoop.releaseWritesWhenDue`). With fewer running, they go at once.
    public var writePacing: Double = 0.002
    public var pacedTransfers = 4
    public var pacedClaims = 3
    /// The service manager's notify socket: the loop sends `WATCHDOG=1` at its interval and a
    /// status line when what it shows changes (nil: nothing is sent).
    public var notifier: ServiceNotifier?
    /// A test hook, set only from `BACKHAUL_TEST_ENGINE_STALL_FILE`: when this file appears, the
    /// loop removes it and sleeps on its own thread for the seconds it holds, as a hung engine
    /// would (tests show the watchdog's keep-alives stop). Never set in production.
    public var testStallFile: String?

    public init() {}
}

/// The transfer engine: a client of the shared curl loop (one thread owns the curl multi
/// handle and every easy handle). It keeps the runnable work in memory (`Scheduler`), fed by the
/// store's commits, starts attempts into free slots, and reports their ends back to the store;
/// the rules of what an end does to a task are Core's (`TaskRecord.applying`).
///
/// This type is the engine's face to the rest of the daemon (start, stop, status); the loop that
/// runs on the curl loop's thread is `EngineLoop`.
public final class Engine: TransferStatus {
    struct Shared {
        var stopDeadline: Double?
        var stopped = false
        var live: [String: LiveProgress] = [:]
        var saturated: Set<String> = []
        var detected = NetworkState.disconnected
        /// NetworkManager's view; nil while it is not on the bus (or not followed).
        var managed: NetworkState?
        var metrics = EngineMetrics()
    }

    let store: any StateStore
    let settings: ServiceSettings
    let curlLoop: CurlLoop
    let logger: Logger
    let options: EngineOptions
    let clock: any Clock
    let shared = Locked(Shared())
    /// What the store and the writer's answers hand over to the loop, taken on its thread.
    let inbox: EngineInbox
    private nonisolated(unsafe) var loop: EngineLoop?
    private nonisolated(unsafe) var watcher: NetworkManagerWatcher?

    public init(
        store: any StateStore, settings: ServiceSettings, curlLoop: CurlLoop, logger: Logger,
        options: EngineOptions = EngineOptions(),
        clock: any Clock = SystemClock()
    ) {
        self.store = store
        self.settings = settings
        self.curlLoop = curlLoop
        inbox = EngineInbox { [curlLoop] in curlLoop.wake() }
        self.logger = logger
        self.options = options
        self.clock = clock
        let detected = NetworkDetection.detect(routeFile: options.routeFile, classifier: settings.classifier)
        shared.withLock { $0.detected = detected }
        // Every commit that changed something reaches the loop (on the store's writer or settler
        // thread: only a hand-over and a wake here).
        store.observe { [inbox] changes in inbox.post(changes) }
    }

    /// Puts interrupted tasks back in the queue, and joins the curl loop (which must then be
    /// started). With transfers disabled by the policy, unfinished tasks are cancelled first.
    public func start() throws {
        let recovered = try store.recoverInterrupted()
        if recovered.requeued > 0 {
            logger.info("re-queued tasks interrupted by the last stop", metadata: ["tasks.count": "\(recovered.requeued)"])
        }
        for id in recovered.failed {
            logger.error(
                "a task's stored state cannot be read: it failed with internal_error (-3100)",
                metadata: ["task.id": "\(id)"])
        }
        if !settings.policy.transfersEnabled {
            let count = try store.cancelUnfinished(reason: .backgroundUpdatesDisabled)
            if count > 0 {
                logger.notice("transfers are disabled: unfinished tasks cancelled", metadata: ["tasks.count": "\(count)"])
            }
        }
        if options.networkSource != .routingTable {
            let watcher = NetworkManagerWatcher(logger: logger, classifier: settings.classifier) { [weak self] state in
                self?.networkManagerSaid(state)
            }
            self.watcher = watcher
            watcher.start()
        }
        // The end of each credential lookup makes the loop review the tasks held for keys; a
        // failed one is logged with its source and error (once a backoff, so never a flood).
        if let chain = options.awsCredentials {
            chain.onChange { [inbox, logger, weak chain] in
                if let error = chain?.lastError {
                    logger.warning("the AWS credential chain has no keys; s3 tasks wait", metadata: ["error": "\(error)"])
                }
                inbox.requestPolicyReview()
            }
        }
        let loop = EngineLoop(engine: self)
        self.loop = loop
        curlLoop.register(loop)
    }

    /// NetworkManager's view changed (nil: it left the bus): the loop decides again at once.
    func networkManagerSaid(_ state: NetworkState?) {
        let changed = shared.withLock { shared in
            defer { shared.managed = state }
            return shared.managed != state
        }
        guard changed else { return }
        logger.info(
            state == nil
                ? "NetworkManager is not on the bus: the network is read from the routing table"
                : "NetworkManager: the network changed",
            metadata: state.map {
                [
                    "network.type": "\($0.type.rawValue)", "network.expensive": "\($0.expensive)",
                    "network.constrained": "\($0.constrained)", "network.roaming": "\($0.roaming)",
                    "network.connectivity": "\($0.connectivity.rawValue)",
                ]
            } ?? [:])
        inbox.requestPolicyReview()
    }

    /// Stops starting transfers, lets running ones finish within `grace` seconds, puts the rest
    /// back in the queue (their attempt not counted), and waits until the loop is done.
    public func shutdown(grace: Double) {
        shared.withLock { $0.stopDeadline = monotonicSeconds() + grace }
        curlLoop.wake()
        shared.wait(until: { $0.stopped }, timeout: grace + 30) { _ in }
        watcher?.stop()
        options.awsCredentials?.stop()
    }

    // MARK: TransferStatus

    public var isRunning: Bool { shared.withLock { $0.stopDeadline == nil && !$0.stopped } }

    public func liveProgress(taskID: String) -> LiveProgress? { shared.withLock { $0.live[taskID] } }

    public func isHostSaturated(sessionID: String, hostKey: String) -> Bool {
        shared.withLock { $0.saturated.contains(sessionID + " " + hostKey) }
    }

    public var metrics: EngineMetrics { shared.withLock { $0.metrics } }

    /// The network as detected; `refresh` reads the routing table now (a change wakes the loop to
    /// decide again).
    public func detectedNetwork(refresh: Bool) -> NetworkState {
        if options.networkSource != .networkManager, refresh, refreshDetectedNetwork() {
            inbox.requestPolicyReview()
        }
        return shared.withLock { sourced($0) }
    }

    /// NetworkManager's view while it is on the bus, else the routing table's (with
    /// `networkmanager` alone: none).
    private func sourced(_ shared: Shared) -> NetworkState {
        if let managed = shared.managed { return managed }
        return options.networkSource == .networkManager ? NetworkState(type: .none, source: .networkManager) : shared.detected
    }

    /// Reads the routing table; true when the detected network changed.
    func refreshDetectedNetwork() -> Bool {
        let detected = NetworkDetection.detect(routeFile: options.routeFile, classifier: settings.classifier)
        return shared.withLock { state in
            defer { state.detected = detected }
            return state.detected != detected
        }
    }

    /// The network in force: the override if a host agent set one, else what was detected.
    var network: NetworkState { settings.networkOverride ?? shared.withLock { sourced($0) } }
}

/// What other threads hand the engine's loop, in the order it happened: the store's changes
/// (from each commit) and the answers to its writes (posted after the same commit), so a claim
/// and a later cancel of the same task are seen in that order.
final class EngineInbox: Sendable {
    enum Item: Sendable {
        case changes(StoreChanges)
        case work(@Sendable (EngineLoop) -> Void)
    }

    private let state = Locked<(items: [Item], policyReview: Bool)>(([], false))
    private let wake: @Sendable () -> Void

    /// `wake`: makes the loop take a turn (the curl loop's wake-up).
    init(wake: @escaping @Sendable () -> Void) { self.wake = wake }

    func post(_ changes: StoreChanges) { add { $0.items.append(.changes(changes)) } }

    /// Runs `work` on the loop's thread at its next turn.
    func post(_ work: @escaping @Sendable (EngineLoop) -> Void) { add { $0.items.append(.work(work)) } }

    func requestPolicyReview() { add { $0.policyReview = true } }

    /// Adds to the inbox, and wakes the loop when the inbox was empty: a post into a non-empty
    /// inbox joins what the wake of the post that filled it has the loop take (the loop takes
    /// the whole inbox at each turn, and a wake that comes while it is awake makes it turn again).
    /// A commit's settlement posts its changes and every answer of the batch: one wake, not one each.
    private func add(_ change: (inout (items: [Item], policyReview: Bool)) -> Void) {
        let wasEmpty = state.withLock { state -> Bool in
            let empty = state.items.isEmpty && !state.policyReview
            change(&state)
            return empty
        }
        if wasEmpty { wake() }
    }

    func take() -> (items: [Item], policyReview: Bool) {
        state.withLock { state in
            defer { state = ([], false) }
            return state
        }
    }
}

/// The default route's interface, classified (docs/policy.md); a table that cannot be read counts as
/// `other` (detection failing must not stop uploads).
enum NetworkDetection {
    static func detect(routeFile: String, classifier: NetworkClassifier) -> NetworkState {
        guard let bytes = SmallFile.read(routeFile) else { return NetworkState(type: .other, interface: nil) }
        let interface = NetworkClassifier.defaultInterface(routeTable: String(decoding: bytes, as: UTF8.self))
        return classifier.classify(interface: interface)
    }
}
