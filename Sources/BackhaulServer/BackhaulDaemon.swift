import BackhaulAPI
import BackhaulCore
import BackhaulEngine
import BackhaulFiles
import BackhaulPostgres
import BackhaulQueue
import BackhaulSQLite
import BackhaulWebhooks
import Curl
import Glibc
import JSONCodec
import Logging
import MicroHTTP
import Systemd
import Threads

/// The daemon: services started in dependency order (store, engine, HTTP) and stopped in reverse.
public final class BackhaulDaemon: Sendable {
    public let configuration: DaemonConfiguration
    let logger: Logger
    let store: any StateStore
    /// The fleet's store when the state is in PostgreSQL (`--state postgres://…`), else nil.
    let fleet: PostgresStore?
    let settings: ServiceSettings
    let curlLoop: CurlLoop
    let engine: Engine
    let dispatcher: WebhookDispatcher
    let housekeeper: Housekeeper
    let feed = EventFeed()
    let http: Daemon
    /// The state directory's lock (SQLite), or -1.
    let lockDescriptor: Int32
    /// systemd's notify socket (`Type=notify`; nothing is sent without `NOTIFY_SOCKET`).
    let notifier = ServiceNotifier()
    /// The sync failure the state failed closed on, once one did (the process then stops).
    private let failedClosed = Locked<SyncFailure?>(nil)
    private let failStop = WorkerThread(name: "bh-failstop")
    /// How long a daemon whose state failed closed keeps answering (every write 503 or 507,
    /// `/readyz` 503) before it stops itself for its supervisor to start it again.
    static let failedClosedHoldSeconds = 3.0

    public struct StartupError: Error, CustomStringConvertible {
        public var description: String
    }

    /// `damageFound`: damage SQLite found in the state while it opened and started, if any.
    public init(configuration: DaemonConfiguration, logger: Logger, damageFound: Locked<StateDamage?> = Locked(nil)) throws {
        self.configuration = configuration
        self.logger = logger
        guard configuration.isLoopback || configuration.tokens != nil else {
            throw StartupError(
                description:
                    "refusing to listen on \(configuration.listen): without API tokens backhauld serves loopback addresses only")
        }
        if let url = configuration.stateURL {
            let fleet = try Self.openFleet(url: url, configuration: configuration)
            self.fleet = fleet
            store = fleet
            lockDescriptor = -1
        } else {
            fleet = nil
            let directory = configuration.stateDirectory
            if mkdir(directory, 0o700) != 0 && errno != EEXIST {
                throw StartupError(
                    description: "cannot create the state directory \(directory): \(String(cString: strerror(errno)))")
            }
            lockDescriptor = open(directory + "/lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            guard lockDescriptor >= 0, flock(lockDescriptor, LOCK_EX | LOCK_NB) == 0 else {
                throw StartupError(description: "the state directory \(directory) is in use by another backhauld")
            }
            store = try Self.openSQLite(
                path: directory + "/backhaul.db", configuration: configuration, logger: logger, failedClosed: failedClosed,
                damageFound: damageFound, failStop: failStop)
        }
        let roots = AllowedRoots(configuration.allowedRoots, shared: configuration.sharedRoots)
        let removalLogger = logger
        let removal = FileRemoval(roots: roots) { [store] file, failure in
            var metadata: Logger.Metadata = ["task.id": "\(file.taskID)", "error": "\(failure.error.message)"]
            if let code = failure.errno { metadata["errno"] = "\(code)" }
            removalLogger.warning("a file was not removed", metadata: metadata)
            store.recordFileNotRemoved(taskID: file.taskID, failure.error)
        }
        store.removeFiles(with: removal)
        settings = try ServiceSettings(
            store: store, basePolicy: configuration.policy, classifier: configuration.classifier, node: fleet?.node)
        let errorLogger = logger
        var dispatcherOptions = DispatcherOptions()
        // The connection cache holds four connections for every transfer and delivery that can
        // run at once (libcurl's own ratio, on the most that can run rather than on those running
        // at the moment); libcurl closes a connection left unused for two minutes.
        curlLoop = try CurlLoop(keptConnections: 4 * (configuration.maxConcurrentTransfers + dispatcherOptions.maxInFlight)) {
            message in errorLogger.error("the curl loop failed", metadata: ["error": "\(message)"])
        }
        var engineOptions = EngineOptions()
        engineOptions.maxConcurrentTransfers = configuration.maxConcurrentTransfers
        engineOptions.caBundle = configuration.caBundle
        engineOptions.progressInterval = configuration.progressInterval
        engineOptions.writePacing = configuration.writePacing
        engineOptions.routeFile = configuration.routeFile
        engineOptions.networkCheckInterval = configuration.networkCheckInterval
        engineOptions.networkSource = configuration.networkSource
        engineOptions.denyPrivateDestinations = configuration.destinations.denyPrivate
        engineOptions.notifier = notifier
        engineOptions.testStallFile = getenv("BACKHAUL_TEST_ENGINE_STALL_FILE").map { String(cString: $0) }
        engineOptions.destinations = configuration.destinations
        engineOptions.allowedRoots = roots
        engineOptions.awsCredentials = AWSCredentialChain(environment: processEnvironment(), imds: configuration.awsIMDS)
        engine = Engine(store: store, settings: settings, curlLoop: curlLoop, logger: logger, options: engineOptions)
        dispatcherOptions.schedule = configuration.webhookRetrySchedule
        dispatcherOptions.caBundle = configuration.caBundle
        dispatcherOptions.denyPrivateDestinations = configuration.destinations.denyPrivate
        dispatcher = WebhookDispatcher(store: store, curlLoop: curlLoop, logger: logger, options: dispatcherOptions)
        let feed = self.feed
        store.observe { changes in if changes.eventsAppended { feed.notify() } }
        housekeeper = Housekeeper(store: store, finishedTaskRetention: configuration.finishedTaskRetention) { message in
            errorLogger.error("housekeeping failed", metadata: ["error": "\(message)"])
        }
        try engine.start()
        if let fleet {
            let engine = self.engine
            fleet.reportStatus { (engine.metrics.running, engine.detectedNetwork(refresh: false).json.serialized()) }
            let logger = self.logger
            fleet.reportUnreadable { ids in
                for id in ids {
                    logger.error(
                        "a task's stored state cannot be read: it failed with internal_error (-3100)",
                        metadata: ["task.id": "\(id)"])
                }
            }
            fleet.startFleet()
        }
        dispatcher.start()
        curlLoop.start()
        housekeeper.start()

        var apiOptions = APIOptions(allowedRoots: roots)
        apiOptions.fileRemoval = removal
        apiOptions.info = configuration.infoJSON
        apiOptions.tokens = configuration.tokens
        apiOptions.destinations = configuration.destinations
        apiOptions.maxOpenTasksPerSession = configuration.maxOpenTasksPerSession
        apiOptions.dashboard = configuration.dashboard
        apiOptions.nodeID = fleet?.node ?? configuration.nodeID ?? Self.hostName()
        let requestMetrics = RequestMetrics()
        let router = API(
            store: store, status: engine, settings: settings, eventFeed: feed, requestMetrics: requestMetrics,
            options: apiOptions, logger: logger
        ).router
        let accessLogger = logger
        let handler = BufferingHandler(
            maxBodyBytes: configuration.maxBodyBytes,
            tooLarge: { head, limit in
                Problem(.payloadTooLarge, "request bodies are limited to \(limit) bytes").response
            },
            handle: { request in
                let started = monotonicSeconds()
                let (response, pattern) = router.handle(request)
                let seconds = monotonicSeconds() - started
                requestMetrics.record(route: pattern, method: request.method, status: response.status, seconds: seconds)
                accessLogger.debug(
                    "request",
                    metadata: [
                        "http.method": "\(request.method)", "http.route": "\(pattern)", "http.status": "\(response.status)",
                        "http.duration_ms": "\(Int(seconds * 1000))",
                    ])
                return response
            })
        do {
            http = try Daemon(
                host: configuration.listenHost, port: configuration.listenPort,
                threading: .threadPerConnection, handler: handler)
        } catch {
            engine.shutdown(grace: 0)
            dispatcher.shutdown()
            curlLoop.stop()
            housekeeper.stop()
            store.close()
            throw StartupError(description: error.description)
        }
        logger.info(
            "listening",
            metadata: [
                "http.address": "\(configuration.listenHost)", "http.port": "\(http.port)",
                "state": "\(fleet.map { "postgresql, node \($0.node)" } ?? configuration.stateDirectory)",
                "version": "\(BackhaulVersion.string)",
            ])
        // The state is open, the engine runs and the API listens.
        (store as? Store)?.started()
        notifier.ready()
    }

    public var port: UInt16 { http.port }

    /// The sync failure the state failed closed on, or nil.
    public var stateFailure: SyncFailure? { failedClosed.withLock { $0 } }

    /// Graceful stop: no new connections, transfers reach a checkpoint within the grace period,
    /// state is persisted, then HTTP closes.
    public func stop() {
        logger.info("stopping", metadata: ["shutdown.grace_seconds": "\(configuration.shutdownGraceSeconds)"])
        notifier.stopping(status: "stopping: transfers reach a checkpoint within \(configuration.shutdownGraceSeconds) s")
        let steps = StopSteps(logger: logger, patience: configuration.shutdownGraceSeconds + 5)
        steps.run("the HTTP listener's quiesce") { http.quiesce() }
        steps.run("the event streams") { feed.close() }
        // A database that stops answering is not waited for past the grace (a fleet's).
        store.beginStop(within: configuration.shutdownGraceSeconds)
        steps.run("the engine") { engine.shutdown(grace: configuration.shutdownGraceSeconds) }
        steps.run("the webhook dispatcher") { dispatcher.shutdown() }
        steps.run("the transfer loop") { curlLoop.stop() }
        steps.run("the housekeeper") { housekeeper.stop() }
        steps.run("the HTTP connections") { http.stop() }
        steps.run("the state store") { store.close() }
        steps.run("the failed-closed stop") { failStop.join() }
        steps.finish()
        if lockDescriptor >= 0 { close(lockDescriptor) }
        logger.info("stopped")
    }
}

/// The exit statuses of `backhauld` besides 0 (stopped by a signal), 1 (cannot start) and 2 (bad
/// usage).
public enum ExitStatus {
    /// The state database holds a record this build cannot read (EX_DATAERR).
    public static let corruptState: Int32 = 65
    /// The state directory was written by a newer backhauld (its schema is newer than this build's).
    public static let newerState: Int32 = 66
    /// The configuration cannot work as given (EX_CONFIG): the state database's URL or password
    /// does not connect.
    public static let configuration: Int32 = 78
    /// A sync of the state failed (EX_TEMPFAIL): the daemon stopped so that a new process reads the
    /// state from the disk (docs/operations.md, "When the disk fails").
    public static let stateSyncFailed: Int32 = 75
    /// The state database is damaged and its salvage could not finish (EX_TEMPFAIL): the damaged
    /// files are where they were, and the next start tries again.
    public static let salvageUnfinished: Int32 = 75
}

/// The process's environment variables.
func processEnvironment() -> [String: String] {
    var environment: [String: String] = [:]
    var pointer = environ
    while let entry = pointer.pointee {
        let text = String(cString: entry)
        if let equals = text.firstIndex(of: "=") {
            environment[String(text[..<equals])] = String(text[text.index(after: equals)...])
        }
        pointer += 1
    }
    return environment
}

/// Runs the daemon until SIGTERM or SIGINT; returns the exit status.
public func runBackhauld(arguments: [String]) -> Int32 {
    let environment = processEnvironment()
    var cwd = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
    let workingDirectory =
        getcwd(&cwd, cwd.count) != nil ? cwd.withUnsafeBufferPointer { String(cString: $0.baseAddress!) } : "/"
    let configuration: DaemonConfiguration
    switch Result(catching: { () throws(DaemonConfiguration.Invalid) in
        try DaemonConfiguration.resolve(arguments: arguments, environment: environment, workingDirectory: workingDirectory)
    }) {
    case .failure(let error):
        writeStandardError("backhauld: \(error.description)\n")
        return 2
    case .success((_, .help)):
        print(DaemonConfiguration.usage)
        return 0
    case .success((_, .version)):
        print("backhauld \(BackhaulVersion.string)")
        return 0
    case .success((let resolved, .run)):
        configuration = resolved
    }
    let level = Logger.Level(rawValue: configuration.logLevel) ?? .info
    LoggingSystem.bootstrap { label in JSONLogHandler(label: label, level: level) }
    let logger = Logger(label: "backhauld")

    keepTransferBuffers()
    // Signals are taken synchronously by this thread; every thread started later inherits the mask.
    signal(SIGPIPE, SIG_IGN)
    var signals = sigset_t()
    sigemptyset(&signals)
    sigaddset(&signals, SIGTERM)
    sigaddset(&signals, SIGINT)
    pthread_sigmask(SIG_BLOCK, &signals, nil)

    let daemon: BackhaulDaemon
    let damageFound = Locked<StateDamage?>(nil)
    do {
        do {
            daemon = try BackhaulDaemon(configuration: configuration, logger: logger, damageFound: damageFound)
        } catch {
            let damage = damageFound.withLock { $0 }
            BackhaulDaemon.startAgainForDamage(damage, configuration: configuration, logger: logger)
            // Refused as damage found at open is (exit 65), not as a start that failed.
            if let damage, configuration.onCorruptState == .refuse { throw StoreError.corrupt(damage.reason) }
            throw error
        }
    } catch let error as SalvageFailure {
        logger.critical(
            "cannot start: the state database is damaged and its salvage could not finish; the damaged files are left as they were, and the next start tries again",
            metadata: ["error": "\(error.cause)", "state.damage": "\(error.damage)"])
        return ExitStatus.salvageUnfinished
    } catch let error as PostgresStore.OpenFailure {
        switch error {
        case .cannotConnect:
            logger.critical("cannot start: the state database does not answer as configured", metadata: ["error": "\(error)"])
            return ExitStatus.configuration
        case .newerSchema:
            logger.critical("cannot start: the state database was migrated by a newer backhauld", metadata: ["error": "\(error)"])
            return ExitStatus.newerState
        }
    } catch let error as StoreError {
        if case .corrupt(let message) = error {
            // A state directory this build cannot read as it is (refused, or not something a salvage
            // mends: a record SQLite reads but this build cannot decode): nothing is guessed or dropped.
            logger.critical(
                "cannot start: the state database holds what this build cannot read",
                metadata: [
                    "error": "\(message)",
                    "hint": configuration.onCorruptState == .refuse
                        ? "--on-corrupt-state salvage copies what can be read into a fresh state and keeps the damaged files"
                        : "a record SQLite reads but this build cannot decode: no salvage mends it; restore a backup",
                ])
            return ExitStatus.corruptState
        }
        if case .newerSchema(let found, let supported) = error {
            logger.critical(
                "cannot start: the state directory was written by a newer backhauld",
                metadata: [
                    "state.schema_version": "\(found)", "supported_schema_version": "\(supported)",
                    "error": "this build reads schema versions up to \(supported); run the newer backhauld, or restore a backup",
                ])
            return ExitStatus.newerState
        }
        logger.critical("cannot start", metadata: ["error": "\(error)"])
        return 1
    } catch {
        logger.critical("cannot start", metadata: ["error": "\(error)"])
        return 1
    }
    var received: Int32 = 0
    sigwait(&signals, &received)
    logger.info("signal received", metadata: ["signal": "\(received == SIGTERM ? "SIGTERM" : "SIGINT")"])
    daemon.stop()
    return daemon.stateFailure == nil ? 0 : ExitStatus.stateSyncFailed
}

/// Keeps freed transfer buffers in the process instead of giving them back to the kernel after
/// each request. libcurl allocates an upload's buffer (`EngineOptions.uploadBufferSize`, 512 KiB)
/// when its request starts and frees it when it ends; with glibc's defaults a buffer that size
/// is a fresh mapping, or heap that was trimmed since, so each upload of a small file paid the
/// kernel to map and zero every page it read into (about a tenth of the daemon's CPU on many
/// small uploads). Blocks up to 1 MiB now come from the heap, and a heap's free top is returned
/// only beyond 8 MiB, what 16 transfers' buffers take.
func keepTransferBuffers() {
    Heap.keep(blocksUpTo: 1 << 20, trimmingAbove: 8 << 20)
}
