import BackhaulCore
import BackhaulQueue
import Glibc
import JSONCodec
import SQLite

/// What the store does with a state database that SQLite reports damaged when it opens.
public enum CorruptStatePolicy: String, Sendable, CaseIterable {
    /// Copies every row that can still be read into a fresh database beside the damaged one, keeps
    /// the damaged files in `corrupt-<UTC time>/`, swaps the fresh one in, and opens that
    /// (`StoreSalvage`); throws `SalvageFailure`, changing nothing, when it cannot finish.
    case salvage
    /// Refuses to open it (`StoreError.corrupt`; the daemon exits 65).
    case refuse
}

/// Finding a damaged state database at open, and salvaging what can still be read of it.
///
/// **Detection.** A database is damaged when SQLite says so while it is examined (`SQLITE_CORRUPT`
/// or `SQLITE_NOTADB` from opening it or reading its version), when `PRAGMA quick_check` finds a
/// fault, when its task counts name a state this build does not know (`Store.verify`), or when its
/// WAL holds frames behind a header that is not valid. SQLite itself does not call that last one
/// corruption: it ignores such a log as if it were empty, so the commits in it since the last
/// checkpoint vanish without an error. The writer syncs the log before it answers a durable write,
/// so a header torn by a power cut covers only commits no client was told were kept; damage to a
/// header that was synced loses acknowledged writes. The two cannot be told apart from the file,
/// and silence is the worse mistake, so both are salvaged (the first loses nothing, the second
/// shows what it lost as unknown).
///
/// `quick_check` rather than `integrity_check`: both read every page, but `quick_check` does not
/// look up each row's index entries, which is most of `integrity_check`'s time (README:
/// Operations has the figures for a state of 100,000 tasks). The faults a disk makes (pages of
/// garbage, a short file) break the b-tree pages that `quick_check` reads.
///
/// **Salvage.** A fresh database is built beside the damaged one (`backhaul.db.salvage`), at the
/// damaged one's schema version (the store's migrations then bring it up to date as they would
/// have), and synced. Only then are the damaged database, its WAL and shared-memory file kept in
/// `corrupt-<UTC time>/` in the state directory (hard links, never deleted by the daemon) and the
/// fresh one renamed over the damaged one. A salvage that cannot finish (no room for the copy, an
/// error) removes what it built and leaves the damaged files where they were (`SalvageFailure`):
/// the state is never emptier than the damaged one. One cut off by a power cut just before its
/// rename is undone by the next start (`undoInterruptedSwap`). Each table is copied in key order from the damaged file, opened read-only; when
/// a scan fails midway, the next readable key is found by seeking past the damage (doubling the
/// step, then halving back to the first key a seek can read from), and the skipped range is
/// counted through an intact index of the table where there is one. Rows the fresh database refuses
/// (a constraint) and tasks in a state this build does not know are lost too, and counted.
/// `session_counts` is computed again from the copied tasks; the AUTOINCREMENT high-water marks are
/// kept (the higher of the damaged file's and the copied rows'), so no id is given twice.
/// SQLite's own recovery (`sqlite3_recover`) is an extension outside the library this links, so the
/// copy uses only the SQL interface.
enum StoreSalvage {
    /// The name of the report beside the damaged files.
    static let reportName = "salvage.json"

    /// Examines the database at `path` before the store opens it. Nothing is done to a database
    /// that is sound (or absent); a damaged one is refused (`StoreError.corrupt`) or salvaged, by
    /// `policy`. Errors other than damage (a file that cannot be opened, a disk error) are thrown
    /// as they are. The report: this salvage's, else the newest an earlier start left.
    /// `thorough`: every page is read (`quick_check`), which takes seconds on a large state; after a
    /// clean stop only the cheap checks run (`CleanStop`). `knownDamage`: damage found by an
    /// earlier attempt of this start, taken as found when the checks find none.
    static func examine(
        path: String, policy: CorruptStatePolicy, now: Timestamp, thorough: Bool = true, knownDamage: String? = nil
    ) throws -> SalvageReport? {
        guard access(path, F_OK) == 0 else { return nil }
        undoInterruptedSwap(path: path)
        guard let damage = try damage(path: path, thorough: thorough) ?? knownDamage else { return lastReport(beside: path) }
        guard policy == .salvage else { throw StoreError.corrupt(damage) }
        return try salvage(path: path, reason: damage, now: now)
    }

    /// The newest salvage report among the `corrupt-*` directories beside `path`.
    static func lastReport(beside path: String) -> SalvageReport? {
        let directory = parentDirectory(of: path)
        guard let newest = entries(of: directory).filter({ $0.hasPrefix("corrupt-") }).max() else { return nil }
        let folder = directory + "/" + newest
        guard let text = readText(folder + "/" + reportName) else { return nil }
        return SalvageReport(json: text, directory: folder)
    }

    // MARK: Detection

    /// What is damaged in the database at `path`, or nil when nothing is. Reads it through a
    /// read-only connection, which neither checkpoints nor removes its WAL.
    static func damage(path: String, thorough: Bool = true) throws -> String? {
        if let fault = walHeaderFault(path + "-wal") { return fault }
        do {
            let db = try Connection(path: path, readOnly: true)
            let migrator = Migrator(migrations: Schema.migrations)
            let version = try migrator.version(db)
            // A newer build's state is refused untouched (`StoreOpening.migrate`), damaged or not:
            // this build cannot copy what it does not know.
            guard version <= migrator.latest else { return nil }
            if thorough {
                let faults = try db.query("PRAGMA quick_check(5)", []) { $0.string(0) }
                if faults != ["ok"] { return "quick_check: " + faults.joined(separator: "; ") }
            }
            // The counts exist from schema version 6 on; `Store.verify` runs again after the migrations.
            if version >= 6 {
                do {
                    try Store.verify(db)
                } catch StoreError.corrupt(let message) {
                    return message
                }
            }
            return nil
        } catch let error as SQLiteError where error.isDamage {
            return error.message
        }
    }

    /// Why the WAL at `path` is one SQLite would ignore although it holds frames, or nil: its
    /// 32-byte header must carry the magic number, the format version and a checksum of its first
    /// 24 bytes (in the byte order the magic number's low bit names). An absent or empty log, or
    /// one shorter than a header, holds nothing.
    static func walHeaderFault(_ path: String) -> String? {
        var status = stat()
        guard stat(path, &status) == 0, status.st_size > 32 else { return nil }
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var header = [UInt8](repeating: 0, count: 32)
        guard pread(descriptor, &header, 32, 0) == 32 else { return "the WAL's header cannot be read" }
        func word(_ offset: Int, bigEndian: Bool = true) -> UInt32 {
            let bytes = header[offset..<offset + 4].map(UInt32.init)
            return bigEndian
                ? bytes[0] << 24 | bytes[1] << 16 | bytes[2] << 8 | bytes[3]
                : bytes[3] << 24 | bytes[2] << 16 | bytes[1] << 8 | bytes[0]
        }
        let magic = word(0)
        let fault = "the WAL's header is damaged: SQLite would ignore the \(status.st_size) bytes of log behind it"
        guard magic & 0xFFFF_FFFE == 0x377F_0682, word(4) == 3_007_000 else { return fault }
        var sums: (UInt32, UInt32) = (0, 0)
        for offset in stride(from: 0, to: 24, by: 8) {
            sums.0 = sums.0 &+ word(offset, bigEndian: magic & 1 == 1) &+ sums.1
            sums.1 = sums.1 &+ word(offset + 4, bigEndian: magic & 1 == 1) &+ sums.0
        }
        return sums == (word(24), word(28)) ? nil : fault
    }

    // MARK: Salvage

    /// The name the salvaged database is built under, beside the damaged one.
    static func buildingPath(for path: String) -> String { path + ".salvage" }

    /// Copies what can be read of the damaged database at `path` into a fresh one built beside it
    /// and synced; keeps the damaged files in `corrupt-<UTC time>/` (hard links, with the report);
    /// then swaps the fresh one in with a rename. Until that rename the damaged files are where
    /// they were: a salvage that cannot finish (a full disk, an error) removes what it built and
    /// throws `SalvageFailure`, and the next start tries again.
    static func salvage(path: String, reason: String, now: Timestamp) throws -> SalvageReport {
        let building = buildingPath(for: path)
        let figures: [SalvageReport.TableFigures]
        do {
            removeDatabase(at: building)
            figures = try build(building, from: path, reason: reason)
            try syncFile(building)
        } catch {
            removeDatabase(at: building)
            throw SalvageFailure(damage: reason, cause: "the salvaged copy could not be built: \(error)")
        }
        var folder: String?
        let report: SalvageReport
        do {
            let kept = try keepDamaged(path: path, now: now)
            folder = kept
            report = SalvageReport(at: now, directory: kept, reason: reason, tables: figures)
            try writeDurably(report.json.serialized() + "\n", to: kept + "/" + reportName)
        } catch {
            if let folder { removeFolder(folder) }
            removeDatabase(at: building)
            throw SalvageFailure(damage: reason, cause: "the damaged files could not be kept: \(error)")
        }
        // The damaged log goes before the swap: SQLite would replay it into any database it finds
        // beside it. The damaged files stay whole in `folder`.
        for ending in ["-wal", "-shm"] { unlink(path + ending) }
        guard rename(building, path) == 0 else {
            let cause = String(cString: strerror(errno))
            removeDatabase(at: building)
            throw SalvageFailure(damage: reason, cause: "the salvaged copy could not be renamed into place: \(cause)")
        }
        if let failure = syncDirectory(of: path) {
            throw SalvageFailure(damage: reason, cause: "the state directory could not be synced after the swap: \(failure)")
        }
        return report
    }

    /// Builds the salvaged database at `building` from the damaged one at `path`, in one
    /// transaction with a rollback journal (a WAL would hold a second copy of every page until
    /// its checkpoint), synced at its commit. Returns the figures per table.
    static func build(_ building: String, from path: String, reason: String) throws -> [SalvageReport.TableFigures] {
        // A file cut short is read through a copy grown back to the length its header gives
        // (SQLite refuses the whole of an auto-vacuum file shorter than that); the pages past the
        // cut read as zeros, which the copy skips as damaged. The damaged files stay as they were.
        let readPath = try paddedCopy(of: path) ?? path
        defer { if readPath != path { removeDatabase(at: readPath) } }
        // What can be read of the damaged file's schema; nil when not even that can be.
        let damaged = try? Connection(path: readPath, readOnly: true)
        let damagedVersion = damaged.flatMap { try? Migrator(migrations: Schema.migrations).version($0) }
        let latest = Migrator(migrations: Schema.migrations).latest
        let version = damagedVersion.flatMap { (1...latest).contains($0) ? $0 : nil } ?? latest

        let fresh = try Connection(path: building)
        try fresh.execute("PRAGMA journal_mode = DELETE")
        try fresh.execute("PRAGMA synchronous = FULL")
        try Migrator(migrations: Schema.migrations.filter { $0.version <= version }).migrate(fresh)
        var figures: [SalvageReport.TableFigures] = []
        try fresh.transaction {
            for table in try copiedTables(fresh) {
                guard let damaged else {
                    figures.append(SalvageReport.TableFigures(name: table.name, copied: 0, lost: nil))
                    continue
                }
                figures.append(try copy(table, from: damaged, to: fresh))
            }
            if let index = figures.firstIndex(where: { $0.name == "tasks" }), let damaged {
                figures[index].lost = tasksLost(figures[index], damaged: damaged)
            }
            if version >= 6 {
                try fresh.execute(
                    "INSERT INTO session_counts (session_id, state, count) SELECT session_id, state, COUNT(*) FROM tasks GROUP BY session_id, state"
                )
            }
            if let damaged { try keepSequences(from: damaged, in: fresh) }
        }
        if reason.hasPrefix("the WAL's header") {
            // What the ignored log held is not known: say so rather than count none.
            figures = figures.map { SalvageReport.TableFigures(name: $0.name, copied: $0.copied, lost: nil) }
        }
        return figures
    }

    /// Creates `corrupt-<UTC time>/` beside `path` and links the database and its `-wal` and
    /// `-shm` files into it (the names in the state directory stay until the swap), syncing the
    /// new directory so the links survive a power cut. A directory left half made is removed.
    static func keepDamaged(path: String, now: Timestamp) throws -> String {
        let directory = parentDirectory(of: path)
        let stamp = RFC3339.format(now).filter { $0 != "-" && $0 != ":" }.prefix(15) + "Z"
        var folder = directory + "/corrupt-" + stamp
        var suffix = 1
        while mkdir(folder, 0o700) != 0 {
            guard errno == EEXIST, suffix < 100 else {
                throw StoreError.database("cannot create \(folder): \(String(cString: strerror(errno)))")
            }
            suffix += 1
            folder = directory + "/corrupt-" + stamp + "-\(suffix)"
        }
        do {
            for ending in ["", "-wal", "-shm"] {
                let source = path + ending
                guard access(source, F_OK) == 0 else { continue }
                guard link(source, folder + "/" + baseName(of: path) + ending) == 0 else {
                    throw StoreError.database("cannot link \(source) into \(folder): \(String(cString: strerror(errno)))")
                }
            }
            for synced in [folder, directory] {
                if let failure = syncDirectory(at: synced) { throw StoreError.syncFailed(failure) }
            }
        } catch {
            removeFolder(folder)
            throw error
        }
        return folder
    }

    /// A salvage cut off (a power cut, a kill) after it removed the damaged log and before its
    /// rename left the damaged database in place without its log; the newest `corrupt-*/` holds
    /// that same file (the same inode) and the log whole. The log is linked back and that
    /// directory removed, so this start salvages from the damaged files as they were.
    static func undoInterruptedSwap(path: String) {
        let directory = parentDirectory(of: path)
        guard let newest = entries(of: directory).filter({ $0.hasPrefix("corrupt-") }).max() else { return }
        let folder = directory + "/" + newest
        let kept = folder + "/" + baseName(of: path)
        var live = stat()
        var copy = stat()
        guard stat(path, &live) == 0, stat(kept, &copy) == 0, live.st_dev == copy.st_dev, live.st_ino == copy.st_ino else {
            return
        }
        if access(path + "-wal", F_OK) != 0, access(kept + "-wal", F_OK) == 0 {
            guard link(kept + "-wal", path + "-wal") == 0 else { return }
        }
        removeFolder(folder)
        _ = syncDirectory(at: directory)
    }
}
