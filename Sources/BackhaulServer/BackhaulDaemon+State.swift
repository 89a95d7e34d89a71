import BackhaulCore
import BackhaulPostgres
import BackhaulQueue
import BackhaulSQLite
import Glibc
import Logging
import Threads

/// Opening the state: SQLite in the state directory (the default), or PostgreSQL shared by a fleet.
extension BackhaulDaemon {
    /// The SQLite state; a sync that fails later fails the store closed and stops the daemon.
    /// Damage SQLite finds while it is open is logged and kept in `damageFound`; the store leaves
    /// no clean-stop mark until the start completed (`Store.started`).
    static func openSQLite(
        path: String, configuration: DaemonConfiguration, logger: Logger, failedClosed: Locked<SyncFailure?>,
        damageFound: Locked<StateDamage?>, failStop: WorkerThread
    ) throws -> Store {
        var walPolicy = WALPolicy()
        walPolicy.capFrames = configuration.walCapFrames
        let store = try Store(
            path: path, walPolicy: walPolicy, onCorruptState: configuration.onCorruptState,
            knownDamage: getenv(damageVariable).map { String(cString: $0) }, awaitingStart: true
        ) { incident in
            switch incident {
            case .checked(let tables, let seconds):
                logger.info(
                    "the background check of every page found no damage",
                    metadata: ["state.tables": "\(tables)", "check.duration_ms": "\(Int(seconds * 1000))"])
            case .damaged(let damage):
                damageFound.withLock { $0 = damage }
                logger.critical(
                    "the state database is damaged: /v1/info and the metrics report it, and the next start reads every page and salvages",
                    metadata: ["state.damage": "\(damage.reason)", "state.damage_found_by": "\(damage.foundBy)"])
            case .checkpointFailed(let failure):
                logger.error(
                    "a WAL checkpoint failed; it is tried again later",
                    metadata: ["checkpoint.mode": "\(failure.mode)", "error": "\(failure.error)"])
            case .failedClosed(let failure):
                logger.critical(
                    "a sync of the state failed: no write is answered from now on, and backhauld stops for its supervisor to start it again",
                    metadata: [
                        "errno": "\(failure.errnoName)", "sync.call": "\(failure.call)", "sync.path": "\(failure.path)",
                        "error": "\(failure)",
                    ])
                failedClosed.withLock { $0 = failure }
                failStop.start {
                    usleep(UInt32(BackhaulDaemon.failedClosedHoldSeconds * 1_000_000))
                    kill(getpid(), SIGTERM)
                }
            }
        }
        if let salvage = store.salvage, salvage.isNew {
            logger.critical(
                "the state database was damaged: salvaged what could be read into a fresh one",
                metadata: [
                    "state.salvaged_from": "\(salvage.directory)", "state.damage": "\(salvage.reason)",
                    "state.rows_copied": "\(salvage.rowsCopied)",
                    "state.rows_lost": "\(salvage.rowsLost.map(String.init) ?? "unknown")",
                    "state.tables":
                        "\(salvage.tables.map { "\($0.name) \($0.copied) copied, \($0.lost.map(String.init) ?? "unknown") lost" }.joined(separator: "; "))",
                ])
        }
        return store
    }

    /// Set (to what was found) when backhauld starts again in place because the state database
    /// was found damaged while it started (`startAgainForDamage`).
    static let damageVariable = "BACKHAUL_DAMAGE_FOUND_AT_START"

    /// A start that failed on damage in a state whose open skipped the check of every page (after
    /// a clean stop) starts again in the same process (`execv` of its own executable, once), so
    /// that nothing of the failed attempt is carried over: the second attempt reads every page
    /// and salvages, and takes the damage as found even if that check finds none. Returns only
    /// when it does not start again.
    static func startAgainForDamage(_ damage: StateDamage?, configuration: DaemonConfiguration, logger: Logger) {
        guard let damage, configuration.onCorruptState == .salvage, getenv(damageVariable) == nil else { return }
        logger.critical(
            "cannot start: the state database is damaged; backhauld starts again in place, reads every page and salvages",
            metadata: ["state.damage": "\(damage.reason)", "state.damage_found_by": "\(damage.foundBy)"])
        setenv(damageVariable, damage.reason, 1)
        execv("/proc/self/exe", CommandLine.unsafeArgv)
        logger.critical("cannot start again in place", metadata: ["error": "\(String(cString: strerror(errno)))"])
    }

    /// The fleet's state in PostgreSQL (docs/fleet.md). A URL or password that does not connect
    /// is a configuration error (exit 78), a newer schema exit 66.
    static func openFleet(url: String, configuration: DaemonConfiguration) throws -> PostgresStore {
        var options = PostgresStore.Options(url: url, node: configuration.nodeID ?? hostName())
        options.leaseSeconds = configuration.leaseSeconds
        options.sharedRoots = configuration.sharedRoots
        options.version = BackhaulVersion.string
        return try PostgresStore(options)
    }

    /// The machine's host name, this node's id by default.
    static func hostName() -> String {
        var name = [CChar](repeating: 0, count: 256)
        guard gethostname(&name, name.count - 1) == 0 else { return "localhost" }
        return name.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }
}
