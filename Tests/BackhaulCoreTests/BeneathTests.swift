import BackhaulCore
import BackhaulFiles
import Foundation
import Glibc
import Testing
import Threads

/// Files by handle (docs/security.md), in process: the walk beneath a root by `openat2` and by
/// one `openat` per component, and the removal that acts on the held directory. The daemon's
/// side of it (a swap during an upload, a download, before a start, across a restart) is
/// EndToEndTests' FilesByHandleTests.
@Suite("Files by handle")
struct BeneathTests {
    /// `root/d/f` and `outside/f`, in a fresh directory removed at the end.
    final class World {
        let base: String
        let roots: AllowedRoots
        var root: String { base + "/root" }
        var outside: String { base + "/outside" }
        var file: String { root + "/d/f" }

        init() throws {
            var template = Array("/tmp/backhaul-beneath-XXXXXX".utf8CString)
            base = String(cString: try #require(mkdtemp(&template)))
            for directory in ["/root/d", "/outside"] {
                try FileManager.default.createDirectory(atPath: base + directory, withIntermediateDirectories: true)
            }
            roots = AllowedRoots([base + "/root"])
            for path in [root + "/d/f", outside + "/f"] {
                try #require(FileManager.default.createFile(atPath: path, contents: Data("twelve bytes".utf8)))
            }
        }

        deinit { try? FileManager.default.removeItem(atPath: base) }

        /// `d` becomes `d.old`, and `d` a link to `outside`.
        func swap() throws {
            try #require(rename(root + "/d", root + "/d.old") == 0)
            try #require(symlink(outside, root + "/d") == 0)
        }

        func info(_ path: String) throws -> FileInfo {
            try AllowedRoots([base]).inspect(path).get()
        }

        func exists(_ path: String) -> Bool { access(path, F_OK) == 0 }
    }

    @Test(
        "the walk opens the parent beneath the root, and refuses a swapped directory, by openat2 and per component",
        arguments: [false, true])
    func walk(_ componentsOnly: Bool) throws {
        let world = try World()
        let held = try Beneath.parent(of: world.file, roots: world.roots, componentsOnly: componentsOnly).get()
        #expect(held.name == "f" && held.statName() != nil)
        try world.swap()
        let swapped = Beneath.parent(of: world.file, roots: world.roots, componentsOnly: componentsOnly)
        guard case .failure(.swapped) = swapped else {
            Issue.record("a swapped directory was walked: \(swapped)")
            return
        }
        #expect(Beneath.parent(of: world.outside + "/f", roots: world.roots).failed == .outsideRoots)
        #expect(held.statName() != nil, "the directory held before the swap is still the real one")
    }

    @Test(
        "a path not plainly beneath its root (.., ., //, a sibling that shares the root's prefix, the root itself) is refused before any walk",
        arguments: [false, true])
    func lexicallyBeneath(_ componentsOnly: Bool) throws {
        let world = try World()
        try FileManager.default.createDirectory(atPath: world.root + "x/d", withIntermediateDirectories: true)
        try #require(FileManager.default.createFile(atPath: world.root + "x/d/f", contents: Data()))
        for path in [
            world.root + "/../outside/f", world.root + "/./d/f", world.root + "//d/f", world.root + "/d/", world.root + "x/d/f",
            world.root, "d/f",
        ] {
            let opened = Beneath.open(path, roots: world.roots, flags: O_RDONLY, componentsOnly: componentsOnly)
            #expect(opened.failed == .outsideRoots, "\(path): \(opened)")
            #expect(
                Beneath.parent(of: path, roots: world.roots, componentsOnly: componentsOnly).failed == .outsideRoots, "\(path)")
        }
        // The root `/` (the engine's default) holds every plain absolute path.
        let whole = try Beneath.open(world.file, roots: AllowedRoots(["/"]), flags: O_RDONLY, componentsOnly: componentsOnly)
            .get()
        close(whole)
        let top = try Beneath.parent(of: "/tmp", roots: AllowedRoots(["/"]), componentsOnly: componentsOnly).get()
        #expect(top.name == "tmp" && top.statName() != nil)
    }

    @Test("a removal goes through the held directory; a swapped path or another file at the name is reported, not removed")
    func removal() throws {
        let world = try World()
        let recorded = try world.info(world.file)
        let upload = FileToRemove(taskID: "t", file: recorded, kind: .uploadedFile)
        try world.swap()
        let swapped = FileRemoval.remove(upload, roots: world.roots)
        #expect(swapped?.error.code == -3004 && swapped?.error.message.contains("no longer leads") == true, "\(swapped as Any)")
        #expect(world.exists(world.outside + "/f"), "the file outside the roots survives")

        // The real directory back, with another file at the name: not the task's, so kept.
        try #require(unlink(world.root + "/d") == 0)
        try #require(rename(world.root + "/d.old", world.root + "/d") == 0)
        // Made before the old one goes, so it cannot reuse its inode number.
        try #require(FileManager.default.createFile(atPath: world.file + ".new", contents: Data("twelve bytes".utf8)))
        try #require(rename(world.file + ".new", world.file) == 0)
        let other = FileRemoval.remove(upload, roots: world.roots)
        #expect(other?.error.message.contains("another file") == true, "\(other as Any)")
        #expect(world.exists(world.file))

        // The task's own file goes; a file already gone is no failure.
        let own = FileToRemove(taskID: "t", file: try world.info(world.file), kind: .uploadedFile)
        #expect(FileRemoval.remove(own, roots: world.roots) == nil)
        #expect(!world.exists(world.file))
        #expect(FileRemoval.remove(own, roots: world.roots) == nil)

        // A download's `.part` beside its destination.
        try #require(FileManager.default.createFile(atPath: world.file + ".part", contents: Data()))
        let part = FileToRemove(
            taskID: "t", file: FileInfo(path: world.file, size: 0, modifiedAtNanoseconds: 0), kind: .downloadPart)
        #expect(FileRemoval.remove(part, roots: world.roots) == nil)
        #expect(!world.exists(world.file + ".part"))
    }

    @Test("a failed removal is counted and handed to the daemon's report")
    func failureReported() throws {
        let world = try World()
        let upload = FileToRemove(taskID: "t", file: try world.info(world.file), kind: .uploadedFile)
        try world.swap()
        let reported = Locked<[String]>([])
        let removal = FileRemoval(roots: world.roots) { file, _ in reported.withLock { $0.append(file.taskID) } }
        removal.remove([upload])
        #expect(removal.failures == 1)
        #expect(reported.withLock { $0 } == ["t"])
    }

    @Test("a recorded identity is the same inode, and the same device unless under a shared root (another node's mount)")
    func identityAcrossNodes() {
        let roots = AllowedRoots(["/no-such-root", "/no-such-shared"], shared: ["/no-such-shared"])
        let recorded = FileIdentity(device: 1, inode: 7)
        #expect(roots.isRecorded(recorded, FileIdentity(device: 1, inode: 7), at: "/no-such-root/f"))
        #expect(!roots.isRecorded(recorded, FileIdentity(device: 2, inode: 7), at: "/no-such-root/f"))
        #expect(roots.isRecorded(recorded, FileIdentity(device: 2, inode: 7), at: "/no-such-shared/f"))
        #expect(!roots.isRecorded(recorded, FileIdentity(device: 1, inode: 8), at: "/no-such-shared/f"))
    }

    @Test("an upload opened after a swap fails path_changed; one opened before reads on, and its end sees the swap")
    func openedFile() throws {
        let world = try World()
        let recorded = try world.info(world.file)
        #expect(recorded.identity != nil)
        let opened = try OpenedFile.open(recorded, roots: world.roots).get()
        try world.swap()
        #expect(OpenedFile.open(recorded, roots: world.roots).failed?.reason == .pathChanged)
        #expect(opened.checkUnchanged() == nil, "the held descriptor is the file that was recorded")
        #expect(opened.checkUnchangedAtPath()?.reason == .pathChanged)
    }

    @Test("the end of an upload sees its name replaced by another file, or by a link to the file itself")
    func endSeesReplacedName() throws {
        let world = try World()
        let recorded = try world.info(world.file)
        let opened = try OpenedFile.open(recorded, roots: world.roots).get()
        #expect(opened.checkUnchangedAtPath() == nil)
        try #require(rename(world.file, world.root + "/d/kept") == 0)
        try #require(symlink(world.root + "/d/kept", world.file) == 0)
        #expect(opened.checkUnchangedAtPath()?.reason == .pathChanged, "a link at the name, even to the same file")
        try #require(unlink(world.file) == 0)
        try #require(FileManager.default.createFile(atPath: world.file, contents: Data("twelve bytes".utf8)))
        #expect(opened.checkUnchangedAtPath()?.reason == .pathChanged, "another file at the name")
        try #require(unlink(world.file) == 0)
        try #require(mkfifo(world.file, 0o600) == 0)
        #expect(opened.checkUnchangedAtPath()?.reason == .pathChanged, "a FIFO at the name, looked at without blocking")
    }
}

extension Result {
    var failed: Failure? {
        if case .failure(let failure) = self { return failure }
        return nil
    }
}
