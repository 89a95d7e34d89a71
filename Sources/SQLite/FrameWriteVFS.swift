import CSQLite
import Glibc

/// The VFS every `Connection` opens with: the system's default ("unix") in all but one thing,
/// how the WAL is written. SQLite writes each WAL frame with two `pwrite`s, the frame's 24-byte
/// header and then its page, and a commit's frames one after another; here a commit's frames go
/// to the file together, in one `pwrite` (or one per `maxRun` bytes of a larger transaction).
/// On ext4 a frame's two writes had cost 7.3 µs, half of it the header's; a small upload's
/// commits write several frames, and the writer's `pwrite` calls went from 5.1 to 0.9 a task.
///
/// A header appended at the end of the log is held until the page that follows it
/// (`walWriteOneFrame` writes the two back to back); the frame they make is held with the frames
/// before it, until the commit's own frame, whose header carries the database's size in pages
/// (bytes 4–7, zero in every other frame): it and every frame held go in one write, before the
/// call that wrote it returns. That must never wait: right after a commit's last write, SQLite
/// publishes its frames in the WAL index, through the database file's shared memory, not through
/// this file, and other connections read them from the file. Frames before a commit are not
/// published, and nothing of a commit's is read (its own connection reads its pages through
/// this file) before everything held is written: any other call on the file (a read, a sync, a
/// truncation, its size, a lock, a file control), or a write anywhere but the end of what is
/// held, first writes what is held, in order.
///
/// What is held when its transaction rolls back belongs to nothing (frames a transaction wrote
/// before its commit because its cache spilled, then undone) and must never be written: SQLite
/// does not call the log again before it lets the next writer in, and that one appends its
/// frames at the same offsets. Each connection's rollback hook drops it (`dropHeld`, installed by
/// `Connection`; SQLite 3.40 calls the hook for an explicit or automatic rollback and for a close
/// with a transaction open). The hook runs after SQLite has released the write lock, which is
/// safe because nothing calls this connection's log in between. The file's close drops what is
/// still held too. Whatever is held then belongs to no commit, since a commit's last frame writes
/// everything before its call returns.
///
/// Limits, none of which the daemon meets (one writer connection; its VACUUMs, a migration's and
/// the copy before migrating, run at start, before any other connection opens):
/// - A transaction that SQLite ends without rolling back the connection is not seen: a VACUUM or
///   backup copy that fails. What it held goes to the file at the connection's next call on the
///   log, which is harmless unless another connection wrote the database in between.
/// - Only the "main" database's log is covered; the log of a database attached with ATTACH is
///   not.
/// - A second `sqlite3_rollback_hook` on the connection replaces this one.
///
/// Only a 24-byte write that starts a new frame is held as a header: at the end of what was
/// written since the log's own header (offset 0), on the log's frame grid (24 bytes + its page
/// size). Two other writes of 24 bytes go straight through:
/// - SQLite's rewrite of the checksums of frames already in the log (a transaction that spilled
///   its cache) writes headers alone, before that end;
/// - a page that SQLite splits around a sync point (`synchronous=FULL` padding a commit's last
///   frames to a sector) may end in a 24-byte tail at that end, but off the frame grid.
/// Every other file (the database, its journal) is the default VFS's own, unwrapped.
enum FrameWriteVFS {
    static let name = "backhaul-unix"

    /// The default VFS, which does the work.
    nonisolated(unsafe) static let base: UnsafeMutablePointer<sqlite3_vfs> = sqlite3_vfs_find(nil)!

    /// Registered once, after the library's settings (`Connection.configureLibrary`).
    static let registered: Void = {
        let vfs = UnsafeMutablePointer<sqlite3_vfs>.allocate(capacity: 1)
        vfs.initialize(to: base.pointee)
        vfs.pointee.pNext = nil
        vfs.pointee.zName = UnsafePointer(strdup(name))
        vfs.pointee.szOsFile = Int32(realFileOffset) + base.pointee.szOsFile
        vfs.pointee.xOpen = { _, path, file, flags, outFlags in FrameWriteVFS.open(path, file, flags, outFlags) }
        let code = sqlite3_vfs_register(vfs, 0)
        precondition(code == SQLITE_OK, "cannot register the WAL-writing VFS (\(code))")
    }()

    /// Drops what `db`'s WAL file holds, without writing it: called from the connection's rollback
    /// hook, when what is held belongs to a transaction that will never commit.
    static func dropHeld(by db: OpaquePointer) {
        if let file = walFile(of: db) { drop(file) }
    }

    /// The frames `connection`'s WAL file held since it opened (each written whole, header and page
    /// together, unless its transaction rolled back), and the writes that took; zeros when it has no
    /// WAL open (tests).
    static func frameWrites(by connection: Connection) -> (frames: Int, writes: Int) {
        guard let file = walFile(of: connection.handle) else { return (0, 0) }
        return (state(file).pointee.framesHeld, state(file).pointee.runsWritten)
    }

    /// How many times `connection` began its WAL from the start (wrote the log's header): at its
    /// first commit into a new log, and at each after a checkpoint let the log start over.
    static func logsBegun(by connection: Connection) -> Int {
        guard let file = walFile(of: connection.handle) else { return 0 }
        return state(file).pointee.logsBegun
    }

    /// The main database's WAL file as this VFS opened it, nil when it has none open.
    private static func walFile(of db: OpaquePointer) -> UnsafeMutablePointer<sqlite3_file>? {
        var file: UnsafeMutablePointer<sqlite3_file>?
        guard sqlite3_file_control(db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &file) == SQLITE_OK,
            let file, file.pointee.pMethods == UnsafePointer(walMethods)
        else { return nil }
        return file
    }

    // A wrapped WAL file's memory: its `sqlite3_file` (the methods below), the state, then the
    // default VFS's file object.
    private static let stateOffset = MemoryLayout<sqlite3_file>.stride
    private static let realFileOffset = (stateOffset + MemoryLayout<UnsafeMutableRawPointer>.stride + 15) & ~15

    private static func open(
        _ path: UnsafePointer<CChar>?, _ file: UnsafeMutablePointer<sqlite3_file>?, _ flags: Int32,
        _ outFlags: UnsafeMutablePointer<Int32>?
    ) -> Int32 {
        guard let file else { return SQLITE_MISUSE }
        guard flags & SQLITE_OPEN_WAL != 0 else { return base.pointee.xOpen(base, path, file, flags, outFlags) }
        let real = realFile(file)
        let code = base.pointee.xOpen(base, path, real, flags, outFlags)
        guard code == SQLITE_OK, real.pointee.pMethods != nil else {
            file.pointee.pMethods = nil
            return code == SQLITE_OK ? SQLITE_CANTOPEN : code
        }
        let state = UnsafeMutablePointer<HeldFrames>.allocate(capacity: 1)
        state.initialize(to: HeldFrames(header: .allocate(byteCount: HeldFrames.headerSize, alignment: 8)))
        (UnsafeMutableRawPointer(file) + stateOffset).storeBytes(
            of: UnsafeMutableRawPointer(state), as: UnsafeMutableRawPointer.self)
        file.pointee.pMethods = UnsafePointer(walMethods)
        return SQLITE_OK
    }

    private static func realFile(_ file: UnsafeMutablePointer<sqlite3_file>) -> UnsafeMutablePointer<sqlite3_file> {
        (UnsafeMutableRawPointer(file) + realFileOffset).assumingMemoryBound(to: sqlite3_file.self)
    }

    private static func state(_ file: UnsafeMutablePointer<sqlite3_file>) -> UnsafeMutablePointer<HeldFrames> {
        (UnsafeMutableRawPointer(file) + stateOffset).load(as: UnsafeMutableRawPointer.self)
            .assumingMemoryBound(to: HeldFrames.self)
    }

    /// What a wrapped WAL file holds between calls.
    struct HeldFrames {
        /// Where what was written or is held since the log's header ends (0: not known yet).
        var end: Int64 = 0
        /// A frame header waiting for its page, and where it goes (-1: none).
        var headerOffset: Int64 = -1
        let header: UnsafeMutableRawPointer
        /// Whole frames held, back to back, for one write at `runOffset` (-1: none).
        var run: UnsafeMutableRawPointer?
        var runCount = 0
        var runOffset: Int64 = -1
        /// The log's frame size (24 + its page size; 0: not known yet), read from the log's header
        /// when this file writes it, else from the first page written right after a header.
        var frameSize: Int64 = 0
        /// Where the last 24-byte write that went straight through ended (-1: the last write was
        /// not one), so that the page after it tells the frame size.
        var headerEnd: Int64 = -1
        /// Frames held (each written whole unless dropped), and the writes that took.
        var framesHeld = 0
        var runsWritten = 0
        /// The log's headers written: each time the log began (again) from its start.
        var logsBegun = 0

        static let headerSize = 24
        static let logHeaderSize: Int64 = 32
        /// The most one write holds: the unix VFS writes at most 0x1ffff bytes a call (it masks a
        /// larger count; a count of a multiple of 128 KiB then writes nothing, and fails as a full
        /// disk). A larger transaction's frames go out in parts of up to this size.
        static let maxRun = 0x1ffff

        func free() {
            header.deallocate()
            run?.deallocate()
        }
    }

    /// The real file's methods (set by the default VFS's open).
    private static func methods(_ real: UnsafeMutablePointer<sqlite3_file>) -> sqlite3_io_methods {
        real.pointee.pMethods!.pointee
    }

    /// Writes what is held, frames then a header; every call but a write at the end does this first.
    private static func flush(_ file: UnsafeMutablePointer<sqlite3_file>?) -> Int32 {
        guard let file else { return SQLITE_MISUSE }
        let code = writeRun(file)
        let pending = state(file)
        guard code == SQLITE_OK else {
            // The header's frame follows those that failed: it goes with them.
            pending.pointee.headerOffset = -1
            return code
        }
        guard pending.pointee.headerOffset >= 0 else { return code }
        let real = realFile(file)
        let offset = pending.pointee.headerOffset
        pending.pointee.headerOffset = -1
        return methods(real).xWrite(real, pending.pointee.header, Int32(HeldFrames.headerSize), offset)
    }

    /// Forgets what is held. What was written or held ended where the first of it would have
    /// gone; the next transaction starts there or before (at the log's last commit).
    private static func drop(_ file: UnsafeMutablePointer<sqlite3_file>) {
        let pending = state(file)
        let starts = [pending.pointee.runOffset, pending.pointee.headerOffset].filter { $0 >= 0 }
        if let first = starts.min() { pending.pointee.end = first }
        pending.pointee.runOffset = -1
        pending.pointee.runCount = 0
        pending.pointee.headerOffset = -1
    }

    /// Writes the frames held, if any, in one write. Should it fail, they are dropped with it:
    /// SQLite gets the error and abandons the transaction, as it would had their own writes failed.
    private static func writeRun(_ file: UnsafeMutablePointer<sqlite3_file>) -> Int32 {
        let pending = state(file)
        guard pending.pointee.runOffset >= 0 else { return SQLITE_OK }
        let real = realFile(file)
        let (offset, count) = (pending.pointee.runOffset, pending.pointee.runCount)
        pending.pointee.runOffset = -1
        pending.pointee.runCount = 0
        pending.pointee.runsWritten += 1
        return methods(real).xWrite(real, pending.pointee.run!, Int32(count), offset)
    }

    /// Adds the held header and its page, the frame at `start`, to the frames held; writes them
    /// all when it ends a commit (first those held, should it not fit beside them in `maxRun`).
    private static func hold(
        _ file: UnsafeMutablePointer<sqlite3_file>, page: UnsafeRawPointer, _ amount: Int32, frameAt start: Int64
    ) -> Int32 {
        let pending = state(file)
        let headerSize = HeldFrames.headerSize
        let frameBytes = headerSize + Int(amount)
        if pending.pointee.runOffset >= 0,
            pending.pointee.runOffset + Int64(pending.pointee.runCount) != start
                || pending.pointee.runCount + frameBytes > HeldFrames.maxRun
        {
            let code = writeRun(file)
            guard code == SQLITE_OK else { return code }
        }
        // What is held never passes `maxRun` (`write` holds no larger frame): one buffer of that
        // size, made when this file first holds a frame.
        let run = pending.pointee.run ?? .allocate(byteCount: HeldFrames.maxRun, alignment: 16)
        pending.pointee.run = run
        let total = pending.pointee.runCount + frameBytes
        let frame = run + pending.pointee.runCount
        frame.copyMemory(from: pending.pointee.header, byteCount: headerSize)
        (frame + headerSize).copyMemory(from: page, byteCount: Int(amount))
        if pending.pointee.runOffset < 0 { pending.pointee.runOffset = start }
        pending.pointee.runCount = total
        pending.pointee.end = max(pending.pointee.end, start + Int64(frameBytes))
        pending.pointee.framesHeld += 1
        // Bytes 4–7 of a frame's header: the database's size in pages after a commit, else zero.
        let endsCommit = (4..<8).contains { pending.pointee.header.load(fromByteOffset: $0, as: UInt8.self) != 0 }
        return endsCommit ? writeRun(file) : SQLITE_OK
    }

    private static func write(
        _ file: UnsafeMutablePointer<sqlite3_file>?, _ buffer: UnsafeRawPointer?, _ amount: Int32, _ offset: Int64
    ) -> Int32 {
        guard let file, let buffer else { return SQLITE_MISUSE }
        let pending = state(file)
        let real = realFile(file)
        let headerSize = HeldFrames.headerSize
        let logHeaderSize = HeldFrames.logHeaderSize
        if pending.pointee.headerOffset >= 0, offset == pending.pointee.headerOffset + Int64(headerSize),
            headerSize + Int(amount) <= HeldFrames.maxRun
        {
            // The page of the held header: a whole frame, held with the ones before it.
            let start = pending.pointee.headerOffset
            pending.pointee.headerOffset = -1
            return hold(file, page: buffer, amount, frameAt: start)
        }
        let frameSize = pending.pointee.frameSize
        let startsFrame =
            amount == Int32(headerSize) && offset == pending.pointee.end && frameSize > 0
            && (offset - logHeaderSize) % frameSize == 0
        if startsFrame, pending.pointee.headerOffset < 0 {
            pending.pointee.header.copyMemory(from: buffer, byteCount: headerSize)
            pending.pointee.headerOffset = offset
            return SQLITE_OK
        }
        let flushed = flush(file)
        guard flushed == SQLITE_OK else { return flushed }
        let code = methods(real).xWrite(real, buffer, amount, offset)
        guard code == SQLITE_OK else { return code }
        if offset == 0, amount >= Int32(logHeaderSize) {
            pending.pointee.logsBegun += 1
            // The log's header: its page size at bytes 8–11, big-endian (1 stands for 65,536).
            let bytes = buffer.assumingMemoryBound(to: UInt8.self)
            let pageSize = (8..<12).reduce(Int64(0)) { $0 << 8 | Int64(bytes[$1]) }
            pending.pointee.frameSize = (pageSize == 1 ? 65_536 : pageSize) + Int64(headerSize)
        } else if offset == pending.pointee.headerEnd, amount >= 512, amount <= 65_536, amount & (amount - 1) == 0 {
            pending.pointee.frameSize = Int64(amount) + Int64(headerSize)
        }
        pending.pointee.headerEnd = amount == Int32(headerSize) ? offset + Int64(headerSize) : -1
        // The log's header (offset 0) starts it over; anything else extends what is known written.
        pending.pointee.end = offset == 0 ? Int64(amount) : max(pending.pointee.end, offset + Int64(amount))
        return SQLITE_OK
    }

    /// The methods of a wrapped WAL file: `xWrite` above and `xClose`, which drops what is held;
    /// every other one writes what is held first and then is the real file's.
    nonisolated(unsafe) private static let walMethods: UnsafeMutablePointer<sqlite3_io_methods> = {
        var methods = sqlite3_io_methods()
        // The unix VFS's files are version 3 (shared memory, memory-mapped reads) on Linux.
        methods.iVersion = 3
        methods.xClose = { file in
            guard let file else { return SQLITE_MISUSE }
            FrameWriteVFS.drop(file)
            let real = FrameWriteVFS.realFile(file)
            let closed = FrameWriteVFS.methods(real).xClose(real)
            let pending = FrameWriteVFS.state(file)
            pending.pointee.free()
            pending.deinitialize(count: 1)
            pending.deallocate()
            file.pointee.pMethods = nil
            return closed
        }
        methods.xRead = { file, buffer, amount, offset in
            FrameWriteVFS.forward(file) { real, io in io.xRead(real, buffer, amount, offset) }
        }
        methods.xWrite = { file, buffer, amount, offset in FrameWriteVFS.write(file, buffer, amount, offset) }
        methods.xTruncate = { file, size in
            FrameWriteVFS.forward(file) { real, io in
                let code = io.xTruncate(real, size)
                if code == SQLITE_OK, let file {
                    let pending = FrameWriteVFS.state(file)
                    pending.pointee.end = min(pending.pointee.end, size)
                }
                return code
            }
        }
        methods.xSync = { file, flags in FrameWriteVFS.forward(file) { real, io in io.xSync(real, flags) } }
        methods.xFileSize = { file, size in FrameWriteVFS.forward(file) { real, io in io.xFileSize(real, size) } }
        methods.xLock = { file, lock in FrameWriteVFS.forward(file) { real, io in io.xLock(real, lock) } }
        methods.xUnlock = { file, lock in FrameWriteVFS.forward(file) { real, io in io.xUnlock(real, lock) } }
        methods.xCheckReservedLock = { file, out in FrameWriteVFS.forward(file) { real, io in io.xCheckReservedLock(real, out) } }
        methods.xFileControl = { file, op, argument in
            FrameWriteVFS.forward(file) { real, io in io.xFileControl(real, op, argument) }
        }
        methods.xSectorSize = { file in FrameWriteVFS.forward(file) { real, io in io.xSectorSize(real) } }
        methods.xDeviceCharacteristics = { file in
            FrameWriteVFS.forward(file) { real, io in io.xDeviceCharacteristics(real) }
        }
        methods.xShmMap = { file, page, size, extend, pointer in
            FrameWriteVFS.forward(file) { real, io in io.xShmMap(real, page, size, extend, pointer) }
        }
        methods.xShmLock = { file, offset, count, flags in
            FrameWriteVFS.forward(file) { real, io in io.xShmLock(real, offset, count, flags) }
        }
        methods.xShmBarrier = { file in
            _ = FrameWriteVFS.forward(file) { real, io in
                io.xShmBarrier(real)
                return SQLITE_OK
            }
        }
        methods.xShmUnmap = { file, delete in FrameWriteVFS.forward(file) { real, io in io.xShmUnmap(real, delete) } }
        methods.xFetch = { file, offset, amount, pointer in
            FrameWriteVFS.forward(file) { real, io in io.xFetch(real, offset, amount, pointer) }
        }
        methods.xUnfetch = { file, offset, pointer in
            FrameWriteVFS.forward(file) { real, io in io.xUnfetch(real, offset, pointer) }
        }
        let stored = UnsafeMutablePointer<sqlite3_io_methods>.allocate(capacity: 1)
        stored.initialize(to: methods)
        return stored
    }()

    /// Writes what is held, then calls the real file's method.
    private static func forward(
        _ file: UnsafeMutablePointer<sqlite3_file>?, _ call: (UnsafeMutablePointer<sqlite3_file>, sqlite3_io_methods) -> Int32
    ) -> Int32 {
        let code = flush(file)
        guard code == SQLITE_OK, let file else { return code == SQLITE_OK ? SQLITE_MISUSE : code }
        let real = realFile(file)
        return call(real, methods(real))
    }
}
