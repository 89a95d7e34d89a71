import CSQLite
import Foundation
import Testing

@testable import SQLite

/// The WAL that `FrameWriteVFS` writes (a frame's header and page in one write) is the WAL SQLite
/// would have written: a copy of the files taken while the database is open, as a crash leaves
/// them, is recovered whole by the default VFS, and checked by SQLite itself.
@Suite("WAL frames written whole")
struct FrameWriteVFSTests {
    let directory: String

    init() throws {
        directory = NSTemporaryDirectory() + "frame-vfs-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    /// A database in WAL mode that never checkpoints by itself: every commit stays in the log.
    func open(_ name: String) throws -> Connection {
        let db = try Connection(path: "\(directory)/\(name)")
        try db.execute("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0")
        try db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        return db
    }

    /// Copies the database and its WAL (not the WAL index) as they are on disk now, and opens the
    /// copy with SQLite's default VFS, which recovers the log from the file alone: a frame whose
    /// header did not reach the file ends the log there, and the commits after it are lost.
    func recoveredCopy(of name: String, table: String = "t") throws -> (rows: Int64, sum: Int64, check: String) {
        let copy = "\(directory)/copy-\(name)"
        try FileManager.default.copyItem(atPath: "\(directory)/\(name)", toPath: copy)
        try FileManager.default.copyItem(atPath: "\(directory)/\(name)-wal", toPath: copy + "-wal")
        var db: OpaquePointer?
        guard sqlite3_open_v2(copy, &db, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let db else {
            throw SQLiteError(code: SQLITE_CANTOPEN, message: "cannot open the copy")
        }
        defer { sqlite3_close_v2(db) }
        func first(_ sql: String) -> String {
            var statement: OpaquePointer?
            sqlite3_prepare_v2(db, sql, -1, &statement, nil)
            defer { sqlite3_finalize(statement) }
            guard sqlite3_step(statement) == SQLITE_ROW, let text = sqlite3_column_text(statement, 0) else { return "" }
            return String(cString: text)
        }
        return (
            Int64(first("SELECT COUNT(*) FROM \(table)")) ?? -1,
            Int64(first("SELECT COALESCE(SUM(length(v) + k), 0) FROM \(table)")) ?? -1,
            first("PRAGMA integrity_check")
        )
    }

    /// `walLogsBegun` tells a log that started over, which the frame count cannot when the first
    /// commit into the new log is as long as the old log was.
    @Test("the log's new beginnings are counted: the first commit, and each after the log started over")
    func logsBegun() throws {
        let db = try open("begun.db")
        #expect(db.walLogsBegun == 1)
        try db.run("INSERT INTO t (k, v) VALUES (1, 'a')")
        #expect(db.walLogsBegun == 1, "a commit appended to the log")
        // All copied back: the next write starts the log over (a PASSIVE checkpoint, then a write).
        #expect(try db.checkpoint(.passive).map { $0.copied == $0.frames } == true)
        try db.run("INSERT INTO t (k, v) VALUES (2, ?)", [String(repeating: "y", count: 20_000)])
        #expect(db.walLogsBegun == 2)
        // Emptied (TRUNCATE): the next write writes the header again.
        _ = try db.checkpoint(.truncate)
        try db.run("INSERT INTO t (k, v) VALUES (3, 'c')")
        #expect(db.walLogsBegun == 3)
    }

    @Test("small commits: each frame goes whole in one write, and a crash's copy recovers every commit")
    func smallCommits() throws {
        let db = try open("small.db")
        let before = FrameWriteVFS.frameWrites(by: db)
        for index in 0..<200 {
            try db.run("INSERT INTO t (k, v) VALUES (?, ?)", [Int64(index), String(repeating: "x", count: 300 + index)])
        }
        // At least a frame a commit went whole, and each commit in one write.
        let after = FrameWriteVFS.frameWrites(by: db)
        #expect(after.frames - before.frames >= 200)
        #expect(after.writes - before.writes == 200)
        let expected = (0..<200).reduce(Int64(0)) { $0 + Int64(300 + $1) + Int64($1) }
        let recovered = try recoveredCopy(of: "small.db")
        #expect(recovered.rows == 200)
        #expect(recovered.sum == expected)
        #expect(recovered.check == "ok")
    }

    /// A commit that changes many pages (rows across leaves, and an index) writes its frames in
    /// one write where SQLite wrote two a frame; a larger one, in parts of at most `maxRun` bytes
    /// (the most the unix VFS writes at once).
    @Test("a commit's frames go to the file in one write (a large one in 128 KiB parts), and a crash's copy recovers each")
    func commitInOneWrite() throws {
        let db = try open("wide.db")
        try db.execute("CREATE INDEX t_v ON t (v)")
        func commit(_ rows: Int, from first: Int) throws -> (frames: Int, writes: Int) {
            let before = FrameWriteVFS.frameWrites(by: db)
            try db.execute("BEGIN")
            for key in first..<first + rows {
                try db.run("INSERT INTO t (k, v) VALUES (?, ?)", [Int64(key), String(repeating: "w", count: 1500) + "\(key)"])
            }
            try db.execute("COMMIT")
            let after = FrameWriteVFS.frameWrites(by: db)
            return (after.frames - before.frames, after.writes - before.writes)
        }
        let small = try (0..<5).map { try commit(8, from: $0 * 100) }
        #expect(small.allSatisfy { $0.frames >= 10 && $0.writes == 1 }, "frames and writes a commit: \(small)")
        let large = try commit(150, from: 1000)
        let parts = (large.frames * (24 + 4096) + FrameWriteVFS.HeldFrames.maxRun - 1) / FrameWriteVFS.HeldFrames.maxRun
        #expect(large.frames >= 100 && (parts...parts + 1).contains(large.writes), "a large commit: \(large)")
        let recovered = try recoveredCopy(of: "wide.db")
        #expect(recovered.rows == 5 * 8 + 150)
        #expect(recovered.check == "ok")
    }

    /// A transaction larger than the page cache writes pages to the log before its commit; pages
    /// it changes again are written over in place, and at the commit SQLite writes those frames'
    /// headers again, alone (new checksums). Those writes must reach the file as they are.
    @Test("a transaction that spills its cache and rewrites frames in place recovers whole")
    func spilledTransaction() throws {
        let db = try open("spill.db")
        try db.execute("PRAGMA cache_size = 8")
        try db.execute("BEGIN")
        for index in 0..<2000 {
            try db.run("INSERT INTO t (k, v) VALUES (?, ?)", [Int64(index), String(repeating: "y", count: 200)])
        }
        try db.run("UPDATE t SET v = v || 'z'")
        try db.execute("COMMIT")
        // Right after the commit, before the writer touches the log again: what a crash would
        // leave, and what another connection reads.
        let recovered = try recoveredCopy(of: "spill.db")
        #expect(recovered.rows == 2000)
        #expect(recovered.sum == (0..<2000).reduce(Int64(0)) { $0 + 201 + Int64($1) })
        #expect(recovered.check == "ok")
        let reader = try Connection(path: "\(directory)/spill.db", readOnly: true)
        #expect(try reader.queryFirst("SELECT COUNT(*) FROM t WHERE v LIKE '%z'") { $0.int(0) } == 2000)
    }

    /// A transaction that spills its cache writes frames before its commit, and those are held.
    /// When it rolls back instead, SQLite does not call the log again: what was held belongs to
    /// nothing, and must never reach the file, where another writer's commits go next (at the
    /// same offsets). Here a second connection commits after the rollback; the first then reads
    /// (a call on its log), and both the live database and a crash's copy must hold the second's
    /// rows and none of the rolled-back ones.
    @Test("frames held by a transaction that rolls back never reach the log another writer appends to")
    func rolledBackSpillStaysOut() throws {
        let first = try open("rollback.db")
        for key in 1000..<1010 { try first.run("INSERT INTO t (k, v) VALUES (?, ?)", [Int64(key), "seed"]) }
        _ = try first.checkpoint(.truncate)
        try first.execute("PRAGMA cache_size = 8")
        let before = FrameWriteVFS.frameWrites(by: first)
        try first.execute("BEGIN")
        for key in 0..<120 {
            try first.run("INSERT INTO t (k, v) VALUES (?, ?)", [Int64(key), String(repeating: "a", count: 300)])
        }
        #expect(FrameWriteVFS.frameWrites(by: first).frames > before.frames, "the transaction spilled no frames")
        try first.execute("ROLLBACK")

        let second = try Connection(path: "\(directory)/rollback.db")
        try second.execute("PRAGMA wal_autocheckpoint = 0")
        for key in 0..<40 {
            try second.run("INSERT INTO t (k, v) VALUES (?, ?)", [Int64(key), String(repeating: "b", count: 300)])
        }
        #expect(try first.queryFirst("SELECT COUNT(*) FROM t") { $0.int(0) } == 50)

        let reader = try Connection(path: "\(directory)/rollback.db", readOnly: true)
        #expect(try reader.queryFirst("SELECT COUNT(*) FROM t WHERE v LIKE 'b%'") { $0.int(0) } == 40)
        #expect(try reader.queryFirst("SELECT COUNT(*) FROM t WHERE v LIKE 'a%'") { $0.int(0) } == 0)
        let recovered = try recoveredCopy(of: "rollback.db")
        #expect(recovered.rows == 50)
        #expect(recovered.check == "ok")
        withExtendedLifetime(second) {}
    }

    /// With `synchronous=FULL` on a device without power-safe overwrite (`psow=0`), SQLite pads a
    /// commit's last frames to a sector and may split a page around the sync point, ending it with
    /// a 24-byte tail at the log's end. That tail is not a frame header (it is off the frame grid)
    /// and must reach the file before SQLite publishes the commit: after every commit the log is a
    /// whole number of frames, as the default VFS leaves it.
    @Test("a page split around a sync point (FULL, padding) leaves no 24-byte tail held")
    func paddedCommits() throws {
        _ = try Connection(path: ":memory:")  // registers the VFS
        let path = "\(directory)/padded.db"
        var db: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI
        #expect(sqlite3_open_v2("file:\(path)?psow=0", &db, flags, FrameWriteVFS.name) == SQLITE_OK)
        defer { sqlite3_close_v2(db) }
        let setup = """
            PRAGMA page_size = 1024; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = 0;
            CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)
            """
        #expect(sqlite3_exec(db, setup, nil, nil, nil) == SQLITE_OK)
        let frame = 1024 + 24
        var torn: [Int] = []
        for index in 0..<400 {
            #expect(sqlite3_exec(db, "INSERT INTO t VALUES (\(index), printf('%.*c', 100, 'x'))", nil, nil, nil) == SQLITE_OK)
            let size = (try FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? NSNumber)?.intValue ?? 0
            if (size - 32) % frame != 0 { torn.append(index) }
        }
        #expect(torn.isEmpty, "commits that left part of a frame unwritten: \(torn.prefix(5))")
        let recovered = try recoveredCopy(of: "padded.db", table: "t")
        #expect(recovered.rows == 400)
        #expect(recovered.check == "ok")
    }

    /// A connection that opens a log with frames in it (another connection wrote them) learns the
    /// frame size from its own first frame, and one that starts the log over after a TRUNCATE
    /// checkpoint reads it from the log's new header; both then join their frames, and what they
    /// write recovers whole.
    @Test("a log opened with frames in it, and a log started over, are appended to whole")
    func reopenedAndRestartedLog() throws {
        let first = try open("reopen.db")
        for index in 0..<50 { try first.run("INSERT INTO t (k, v) VALUES (?, ?)", [Int64(index), "first"]) }
        let second = try Connection(path: "\(directory)/reopen.db")
        try second.execute("PRAGMA wal_autocheckpoint = 0")
        for index in 50..<100 { try second.run("INSERT INTO t (k, v) VALUES (?, ?)", [Int64(index), "second"]) }
        // Its first frame told it the frame size; every one after it went whole.
        #expect(FrameWriteVFS.frameWrites(by: second).frames >= 49)
        #expect(try recoveredCopy(of: "reopen.db").rows == 100)

        _ = try second.checkpoint(.truncate)
        let walSize = (try FileManager.default.attributesOfItem(atPath: "\(directory)/reopen.db-wal")[.size] as? NSNumber)?
            .intValue
        #expect(walSize == 0)
        for index in 100..<150 { try second.run("INSERT INTO t (k, v) VALUES (?, ?)", [Int64(index), "restarted"]) }
        // The first copy's recovery folded its log into it (and removed the log): copy again.
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: "\(directory)/copy-reopen.db\(suffix)") }
        let recovered = try recoveredCopy(of: "reopen.db")
        #expect(recovered.rows == 150)
        #expect(recovered.check == "ok")
        withExtendedLifetime(first) {}
    }
}
