import BackhaulCore
import Glibc
import SQLite
import Testing
import Threads

@testable import BackhaulQueue

/// A batch whose parts the API adds while the writer inserts the first ones (`TaskBatch`).
@Suite("Task batches in parts")
struct TaskBatchTests {
    static func part(_ range: Range<Int>, key: (Int) -> String? = { _ in nil }) -> [TaskRecord] {
        range.map { makeTask("t\($0)", key: key($0)) }
    }

    /// Runs `body` on a thread of its own (the API's, beside the writer).
    static func onThread(_ body: @escaping @Sendable () -> Void) -> WorkerThread {
        let thread = WorkerThread(name: "test-batch")
        thread.start(body)
        return thread
    }

    @Test(
        "parts added while the writer inserts go in, in order, as one durable write; each part is told as it goes in",
        arguments: Backend.allCases)
    func partsWhileInserting(_ backend: Backend) throws {
        let store = try backend.openWithSession()
        defer { store.close() }
        let batch = TaskBatch(count: 30)
        let pending = store.createTasks(sessionID: "s", batch)
        let toldEarly = Locked(false)
        let adder = Self.onThread {
            for start in stride(from: 0, to: 30, by: 10) {
                // The first part is told as it goes in, before the API has added the last one.
                if start == 20 { toldEarly.withLock { $0 = batch.inserted(part: 0, timeout: 5) != nil } }
                batch.add(Self.part(start..<start + 10, key: { $0 == 25 ? "k" : ($0 == 27 ? "k" : nil) }))
            }
            batch.close()
        }
        let first = try #require(batch.inserted(part: 0))
        #expect(first.map(\.0.id) == (0..<10).map { "t\($0)" })
        let results = try pending.wait()
        adder.join()
        #expect(toldEarly.withLock { $0 })
        // The second task with the key returns the first one, not created.
        #expect(results.map(\.0.id) == (0..<30).map { $0 == 27 ? "t25" : "t\($0)" })
        #expect(results.filter(\.1).count == 29 && batch.run == 1)
        #expect(try store.session(id: "s")?.1[.queued] == 29)
    }

    /// Holds the writer until `release` (once it runs: a write handed over before that would
    /// join its transaction), so that the writes handed over meanwhile share the next one.
    static func holdWriter(_ store: any StateStore) -> @Sendable () -> Void {
        let busy = Locked((running: false, held: true))
        store.submitJob { _ in
            busy.withLockNotifyingAll { $0.running = true }
            while busy.withLock({ $0.held }) { usleep(1_000) }
        }
        busy.wait(until: { $0.running }, timeout: 10) { _ in }
        return { busy.withLock { $0.held = false } }
    }

    /// It holds the writer with a job of its own so that the writes handed over meanwhile share
    /// its next transaction.
    @Test(
        "a batch abandoned after parts went in writes nothing, and the writes sharing its transaction stand, run once",
        arguments: Backend.allCases)
    func abandoned(_ backend: Backend) throws {
        let store = try backend.openWithSession()
        defer { store.close() }
        let release = Self.holdWriter(store)
        let batch = TaskBatch(count: 30)
        let pending = store.createTasks(sessionID: "s", batch)
        let otherRuns = Locked(0)
        let other = Locked<Result<Void, StoreError>?>(nil)
        store.submitJob(
            { run in
                otherRuns.withLock { $0 += 1 }
                try run("INSERT INTO settings (key, value) VALUES ('other', '{}')")
            }, done: { result in other.withLockNotifyingAll { $0 = result } })
        batch.add(Self.part(0..<10))
        release()
        #expect(batch.inserted(part: 0)?.count == 10)
        batch.abandon()
        #expect(try pending.wait().isEmpty)
        #expect(batch.stopped == .abandoned && batch.run == 1)
        #expect(batch.inserted(part: 1) == nil)
        #expect(try store.task(id: "t0") == nil)
        #expect(try store.session(id: "s")?.1.isEmpty == true)
        other.wait(until: { $0 != nil }, timeout: 10) { _ in }
        #expect(otherRuns.withLock { $0 } == 1)
        #expect(try store.setting("other") != nil)
    }

    @Test("a part that does not come in time ends the batch with nothing written", arguments: Backend.allCases)
    func partTimeout(_ backend: Backend) throws {
        let store = try backend.openWithSession()
        defer { store.close() }
        let batch = TaskBatch(count: 20, partTimeout: 0.2)
        let pending = store.createTasks(sessionID: "s", batch)
        batch.add(Self.part(0..<10))
        #expect(try pending.wait().isEmpty)
        #expect(batch.stopped == .timedOut(seconds: 0.2))
        #expect(try store.task(id: "t0") == nil)
    }

    @Test("the open-task limit is checked against the whole batch before any part", arguments: Backend.allCases)
    func limitFirst(_ backend: Backend) throws {
        let store = try backend.openWithSession()
        defer { store.close() }
        let batch = TaskBatch(count: 30)
        let pending = store.createTasks(sessionID: "s", batch, maxOpen: 20)
        #expect(throws: StoreError.tooManyTasks(open: 0, limit: 20)) { try pending.wait() }
        #expect(batch.inserted(part: 0) == nil)
    }

    /// Both writers run a transaction again, with a savepoint per job, when one of its jobs threw:
    /// the batch's insert runs twice, and what it tells must be the second run's.
    @Test(
        "run again after another write of its transaction failed: inserted once, told by the run that committed",
        arguments: Backend.allCases)
    func runAgain(_ backend: Backend) throws {
        let store = try backend.openWithSession()
        defer { store.close() }
        let release = Self.holdWriter(store)
        let batch = TaskBatch(count: 20)
        let pending = store.createTasks(sessionID: "s", batch)
        let failed = Locked<StoreError?>(nil)
        store.submitJob(
            { _ in throw StoreError.conflict("a failing write") },
            done: { result in if case .failure(let error) = result { failed.withLockNotifyingAll { $0 = error } } })
        batch.add(Self.part(0..<10))
        batch.add(Self.part(10..<20))
        batch.close()
        release()
        let results = try pending.wait()
        #expect(results.count == 20 && batch.run == 2)
        // What is told now is the committed run's: the second part with its seqs.
        #expect(batch.inserted(part: 1)?.map(\.0.sequence) == results[10...].map(\.0.sequence))
        #expect(failed.wait(until: { $0 != nil }, timeout: 10) { $0 } == .conflict("a failing write"))
        #expect(try store.session(id: "s")?.1[.queued] == 20)
        #expect(try store.task(id: "t19")?.sequence == results[19].0.sequence)
    }
}
