import BackhaulCore
import BackhaulQueue
import Glibc
import SQLite
import Threads

/// Keeps the first damage found while the store is open, and tells the daemon of it once.
final class DamageWatch: Sendable {
    private let found = Locked<StateDamage?>(nil)
    private let report: @Sendable (StateDamage) -> Void

    init(report: @escaping @Sendable (StateDamage) -> Void) {
        self.report = report
    }

    var damage: StateDamage? { found.withLock { $0 } }

    /// Records `error` when it is damage (`SQLiteError.isDamage`); other errors are not this
    /// watch's.
    func note(_ error: any Error, foundBy: String, at now: Timestamp) {
        guard let error = error as? SQLiteError, error.isDamage else { return }
        note(error.message + (error.sql.map { " (in \($0.prefix(200)))" } ?? ""), foundBy: foundBy, at: now)
    }

    func note(_ reason: String, foundBy: String, at now: Timestamp) {
        let first = found.withLock { found -> StateDamage? in
            guard found == nil else { return nil }
            found = StateDamage(at: now, reason: reason, foundBy: foundBy)
            return found
        }
        if let first { report(first) }
    }
}

/// The page check a start after a clean stop skipped (`CleanStop`), run in the background: table
/// by table (`PRAGMA quick_check(table)`, which checks the table and its indexes), each in a
/// read transaction of its own on a read-only connection, so the writer never waits for it (a
/// WAL reader holds back only the checkpoint, for the one table's check). The thread runs at the
/// lowest priority (nice 19) and rests `restFactor` times as long as each table's check took, so
/// it takes at most a fifth of one core.
final class IntegrityScan: Sendable {
    /// The rest after each table's check, as a multiple of the time the check took.
    static let restFactor = 4.0
    private let path: String
    private let watch: DamageWatch
    private let clock: any Clock
    /// Stopping, and whether every table was checked.
    private let state = Locked((stopping: false, finished: false))
    private let thread = WorkerThread(name: "bh-integrity")
    /// Told, when every table was checked and found sound, how many and in how many seconds.
    private let finished: @Sendable (Int, Double) -> Void

    init(path: String, watch: DamageWatch, clock: any Clock, finished: @escaping @Sendable (Int, Double) -> Void) {
        self.path = path
        self.watch = watch
        self.clock = clock
        self.finished = finished
    }

    func start() { thread.start { [self] in run() } }

    /// Stops the check; returns whether it had checked every table.
    func stop() -> Bool {
        state.withLockNotifyingAll { $0.stopping = true }
        thread.join()
        return state.withLock { $0.finished }
    }

    private func run() {
        // On Linux the nice value is the calling thread's own (setpriority(2), NOTES).
        setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, 19)
        let began = monotonicSeconds()
        do {
            let db = try Connection(path: path, readOnly: true)
            let tables = try db.query(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rootpage"
            ) { $0.string(0) }
            for table in tables {
                let started = monotonicSeconds()
                let faults = try db.query("PRAGMA quick_check('\(table.replacing("'", with: "''"))')") { $0.string(0) }
                if faults != ["ok"] {
                    watch.note(
                        "quick_check of \(table): " + faults.prefix(5).joined(separator: "; "), foundBy: "the background check",
                        at: clock.now())
                    return
                }
                let rest = max(0.01, (monotonicSeconds() - started) * Self.restFactor)
                if state.wait(until: { $0.stopping }, timeout: rest, { $0.stopping }) { return }
            }
            state.withLock { $0.finished = true }
            finished(tables.count, monotonicSeconds() - began)
        } catch {
            // Damage is reported; anything else (the file gone, busy) ends this check unfinished.
            watch.note(error, foundBy: "the background check", at: clock.now())
        }
    }
}
