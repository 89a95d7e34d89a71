import BackhaulCore
import BackhaulTesting
import Foundation
import Glibc
import JSONCodec
import Testing
import Threads

@testable import BackhaulQueue
@testable import BackhaulSQLite

/// Parts of `StateStore` the tests beside it reach only through the API or the engine: counts,
/// bulk cancellation, deletion, retention, settings and budgets, each held to one answer on both
/// backends.
@Suite("Store contract")
struct StoreContractTests {
    let clock = ManualClock()

    @Test("counts by state and by waiting reason follow every transition, and a bulk cancel", arguments: Backend.allCases)
    func counts(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", ["a", "b", "c", "d", "e"].map { makeTask($0) })
        _ = try store.startAttempt(id: "a")
        _ = try store.finishAttempt(id: "a", attempt: 1, bytesTransferred: 10, result: .completed(nil))
        _ = try store.startAttempt(id: "b")
        _ = try store.finishAttempt(
            id: "b", attempt: 1, bytesTransferred: 0, result: .retry(at: clock.now() + 5, TaskError(.timedOut, message: "t"), nil)
        )
        _ = try store.apply(.suspend, to: "c")
        _ = try store.startAttempt(id: "d")
        _ = try store.finishAttempt(id: "d", attempt: 1, bytesTransferred: 0, result: .held(.cellularNotAllowed))
        let expected: [TaskState: Int] = [.completed: 1, .retrying: 1, .suspended: 1, .waiting: 1, .queued: 1]
        #expect(try store.session(id: "s")?.1 == expected)
        #expect(try store.sessions().first?.1 == expected)
        // SQLite's totals keep a state whose count went back to 0; PostgreSQL's leave it out.
        #expect(try store.taskCounts().filter { $0.value != 0 } == expected)
        #expect(try store.waitingCounts() == [.cellularNotAllowed: 1])
        #expect(try store.attempts(taskID: "a")?.count == 1)
        #expect(try store.attempts(taskID: "e") == [])
        #expect(try store.attempts(taskID: "none") == nil)

        #expect(try store.cancelUnfinished(reason: .userCancelled) == 4)
        #expect(try store.session(id: "s")?.1 == [.completed: 1, .cancelled: 4])
        #expect(try store.taskCounts().filter { $0.value != 0 } == [.completed: 1, .cancelled: 4])
        #expect(try store.waitingCounts() == [:])
        #expect(try store.events(after: 0).filter { $0.type == "session.drained" }.count == 1)
    }

    @Test(
        "a final task is deleted, an unfinished one is not; a session deleted goes at once, or with its last task",
        arguments: Backend.allCases)
    func deletion(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [makeTask("a"), makeTask("b")])
        #expect(throws: StoreError.self) { try store.deleteTask(id: "a") }
        _ = try store.apply(.cancel, to: "a")
        try store.deleteTask(id: "a")
        #expect(try store.task(id: "a") == nil)
        #expect(try store.session(id: "s")?.1 == [.queued: 1])
        #expect(try store.deleteSession(id: "s", cancel: true))
        #expect(try store.sessionRecord(id: "s") == nil)
        #expect(try store.session(id: "s") == nil)
        #expect(throws: StoreError.notFound) { try store.deleteSession(id: "s", cancel: true) }
        // Deleted without cancelling, a session with unfinished tasks finishes: it goes with its last task's end.
        _ = try store.putSession(id: "t", configuration: TransferConfiguration())
        _ = try store.createTasks(sessionID: "t", [makeTask("c", session: "t")])
        #expect(try store.deleteSession(id: "t", cancel: false) == false)
        #expect(try store.sessionRecord(id: "t")?.lifecycle == .finishing)
        _ = try store.apply(.cancel, to: "c")
        #expect(try store.sessionRecord(id: "t") == nil)
    }

    @Test(
        "a task's attempt history keeps its last attempts, numbered on, whether an attempt ends or is stopped",
        arguments: Backend.allCases)
    func attemptHistoryLimit(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        let task = try store.createTasks(sessionID: "s", [makeTask("a")])[0].0
        let limit = AttemptRecord.historyLimit
        for number in 1...limit + 3 {
            let now = clock.now()
            store.recordStoppedAttempt(
                sequence: task.sequence,
                AttemptRecord(startedAt: now, endedAt: now, bytesTransferred: Int64(number), bytesReceived: 0, outcome: .stopped))
        }
        _ = try store.startAttempt(id: "a")
        _ = try store.finishAttempt(id: "a", attempt: 1, bytesTransferred: 10, result: .completed(nil))
        let history = try #require(try store.attempts(taskID: "a"))
        #expect(history.count == limit)
        // Newest first.
        #expect(history.map(\.number) == Array((5...limit + 4).reversed()))
        #expect(history.first?.outcome == .completed && history.last?.bytesTransferred == 5)
        // A task that is gone gets no history.
        store.recordStoppedAttempt(sequence: task.sequence + 100, history[0])
        try store.settle()
        #expect(try store.attempts(taskID: "a")?.count == limit)
    }

    @Test("finished tasks go after their retention, the oldest age told first", arguments: Backend.allCases)
    func retention(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [makeTask("old"), makeTask("young"), makeTask("open")])
        _ = try store.apply(.cancel, to: "old")
        clock.advance(100)
        _ = try store.apply(.cancel, to: "young")
        clock.advance(10)
        #expect(try store.oldestFinishedTask(now: clock.now()) == 110)
        #expect(try store.pruneFinishedTasks(defaultRetention: 50) == 1)
        #expect(try store.task(id: "old") == nil && store.task(id: "young") != nil && store.task(id: "open") != nil)
        #expect(try store.oldestFinishedTask(now: clock.now()) == 10)
        #expect(try store.pruneFinishedTasks(defaultRetention: 5) == 1)
        #expect(try store.oldestFinishedTask(now: clock.now()) == nil)
        #expect(try store.session(id: "s")?.1 == [.queued: 1])
    }

    @Test(
        "settings are set, replaced and removed; budget use adds up per network, a new day forgets the old",
        arguments: Backend.allCases)
    func settingsAndBudgets(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        #expect(try store.setting("k") == nil)
        try store.setSetting("k", ["a": 1])
        try store.setSetting("k", ["a": 2])
        #expect(try store.setting("k") == ["a": 2])
        try store.setSetting("k", nil)
        #expect(try store.setting("k") == nil)
        store.addBudgetUsage(day: "2024-01-01", [.wifi: 10, .cellular: 5])
        store.addBudgetUsage(day: "2024-01-01", [.cellular: 7])
        try store.settle()
        #expect(try store.budgetUsage(day: "2024-01-01") == [.wifi: 10, .cellular: 12])
        // A new day's use forgets the days before it.
        store.addBudgetUsage(day: "2024-01-02", [.wifi: 1])
        try store.settle()
        #expect(try store.budgetUsage(day: "2024-01-02") == [.wifi: 1])
        #expect(try store.budgetUsage(day: "2024-01-01") == [:])
    }

    /// The file's device and inode, kept in the `upload` column beside the spec, come back with
    /// the task, and the spec with them.
    @Test("a task's file identity is stored with its upload spec and read back", arguments: Backend.allCases)
    func fileIdentityStored(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        var task = makeTask("id")
        task.file.identity = FileIdentity(device: UInt64.max - 1, inode: 42)
        task.upload = UploadSpec(protocolName: .tus)
        task.upload.contentType = "text/plain"
        _ = try store.createTasks(sessionID: "s", [task, makeTask("none")])
        let stored = try #require(try store.task(id: "id"))
        #expect(stored.file.identity == task.file.identity)
        #expect(stored.upload == task.upload)
        #expect(try store.task(id: "none")?.file.identity == nil)
    }

    /// The file of a completed `delete_file_on_success` task goes once the end committed.
    @Test("a completed delete-on-success task's file is removed; a failed one's stays", arguments: Backend.allCases)
    func fileRemovedOnSuccess(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        let remover = RemoverByPath()
        store.removeFiles(with: remover)
        let directory = TemporaryDirectory("backhaul-contract")
        var paths: [String] = []
        for id in ["ok", "bad"] {
            let path = directory.makeFile(id, size: 1)
            paths.append(path)
            var task = makeTask(id)
            task.file = FileInfo(path: path, size: 1, modifiedAtNanoseconds: 1)
            task.deleteFileOnSuccess = true
            _ = try store.createTasks(sessionID: "s", [task])
            _ = try store.startAttempt(id: id)
        }
        #expect(try store.finishAttempt(id: "ok", attempt: 1, bytesTransferred: 1, result: .completed(nil))?.state == .completed)
        let failure = AttemptEnd.failed(TaskError(.timedOut, message: "t"), nil)
        #expect(try store.finishAttempt(id: "bad", attempt: 1, bytesTransferred: 1, result: failure)?.state == .failed)
        #expect(!FileManager.default.fileExists(atPath: paths[0]))
        #expect(FileManager.default.fileExists(atPath: paths[1]))
        #expect(remover.handed.withLock { $0 }.map(\.taskID) == ["ok"], "only the completed task's file is handed over")
    }
}

/// The store's tests' `FileRemover`: records what the store hands over, and removes an upload's
/// file by its path (the daemon's remover, beneath the allowed roots, is BackhaulFiles'
/// `FileRemoval`, tested end to end).
final class RemoverByPath: FileRemover {
    let handed = Locked<[FileToRemove]>([])

    func remove(_ files: [FileToRemove]) {
        handed.withLock { $0 += files }
        for file in files where file.kind == .uploadedFile { unlink(file.file.path) }
    }
}
