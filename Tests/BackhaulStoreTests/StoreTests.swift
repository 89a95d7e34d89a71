import BackhaulCore
import Foundation
import Glibc
import JSONCodec
import SQLite
import Testing
import Threads

@testable import BackhaulQueue
@testable import BackhaulSQLite

/// A clock tests move by hand.
final class ManualClock: Clock {
    private let time = Locked(1_000_000.0)
    func now() -> Timestamp { time.withLock { $0 } }
    func advance(_ seconds: Double) { time.withLock { $0 += seconds } }
}

func makeTask(
    _ id: String, session: String = "s", key: String? = nil, priority: Double = 0.5, now: Double = 1_000_000,
    deadline: Double = 2_000_000
) -> TaskRecord {
    var task = TaskRecord(
        id: id, sessionID: session, file: FileInfo(path: "/d/\(id)", size: 10, modifiedAtNanoseconds: 1),
        request: RequestSpec(url: "http://h/\(id)", method: "PUT", headers: [("Authorization", "Bearer x")]),
        upload: UploadSpec(), createdAt: now, deadlineAt: deadline)
    task.idempotencyKey = key
    task.priority = priority
    return task
}

@Suite("Store")
struct StoreTests {
    let clock = ManualClock()

    @Test("sessions: create, same again, different conflicts", arguments: Backend.allCases)
    func sessions(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        #expect(try store.putSession(id: "s", configuration: TransferConfiguration()).1 == false)
        var other = TransferConfiguration()
        other.discretionary = true
        #expect(throws: StoreError.sessionExists) { try store.putSession(id: "s", configuration: other) }
        #expect(try store.putSession(id: "t", configuration: other).1 == true)
        #expect(try store.sessions().map(\.0.id) == ["s", "t"])
    }

    @Test("tasks round-trip every field, secrets included (they are needed to run)", arguments: Backend.allCases)
    func roundTrip(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        var task = makeTask("a", key: "k1")
        task.description = "clip"
        task.configurationOverrides = ["allows_cellular_access": false]
        task.earliestBeginAt = 1_000_010
        let created = try store.createTasks(sessionID: "s", [task])
        #expect(created.count == 1 && created[0].1)
        let loaded = try #require(try store.task(id: "a"))
        #expect(loaded.request.headers.first?.1 == "Bearer x")
        #expect(loaded.description == "clip")
        #expect(loaded.state == .waiting && loaded.waitingReason == .scheduled)
        #expect(loaded.configurationOverrides["allows_cellular_access"] == .bool(false))
    }

    /// Every protocol's options, as the API accepts them, come back equal from the row decoder.
    static let uploadSpecs: [UploadSpec] = {
        var multipart = UploadSpec(protocolName: .multipart)
        multipart.field = "clip"
        multipart.filename = "a.mp4"
        multipart.contentType = "video/mp4"
        multipart.fields = [("camera", "7"), ("site", "north")]
        multipart.checksum = .sha256
        var chunked = UploadSpec(protocolName: .chunked)
        chunked.chunkSize = 1 << 20
        var tus = UploadSpec(protocolName: .tus)
        tus.filename = "clip-7.mp4"
        tus.contentType = "video/mp4"
        var s3 = UploadSpec(protocolName: .s3)
        s3.s3 = S3Credentials(region: "eu-west-1", accessKeyID: "AK", secretAccessKey: "SK", sessionToken: "ST")
        var ietf = UploadSpec(protocolName: .ietf)
        ietf.interopVersion = 5
        var auto = UploadSpec(protocolName: .auto)
        auto.interopVersion = 3
        auto.chunkSize = 2 << 20
        return [UploadSpec(), multipart, chunked, UploadSpec(protocolName: .tus), tus, s3, ietf, auto]
    }()

    @Test(
        "every protocol's upload options round-trip (the pinned IETF version included)", arguments: Backend.allCases, uploadSpecs)
    func uploadRoundTrip(_ backend: Backend, spec: UploadSpec) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        var task = makeTask("u")
        task.upload = spec
        _ = try store.createTasks(sessionID: "s", [task])
        let loaded = try #require(try store.task(id: "u"))
        #expect(loaded.upload == spec)
        #expect(loaded.upload.interopVersion == spec.interopVersion)
    }

    @Test("an idempotency key returns the first task, within a batch and across calls", arguments: Backend.allCases)
    func idempotency(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        let first = try store.createTasks(sessionID: "s", [makeTask("a", key: "k"), makeTask("b", key: "k")])
        #expect(first.map(\.0.id) == ["a", "a"])
        #expect(first.map(\.1) == [true, false])
        let again = try store.createTasks(sessionID: "s", [makeTask("c", key: "k")])
        #expect(again[0].0.id == "a" && !again[0].1)
        #expect(try store.task(id: "c") == nil)
    }

    @Test("a batch is all-or-nothing", arguments: Backend.allCases)
    func atomicBatch(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [makeTask("dup")])
        #expect(throws: StoreError.self) { try store.createTasks(sessionID: "s", [makeTask("x1"), makeTask("dup")]) }
        #expect(try store.task(id: "x1") == nil)
    }

    @Test("pagination returns every task exactly once, in creation order", arguments: Backend.allCases)
    func pagination(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", (0..<25).map { makeTask("t\($0)") })
        var seen: [String] = []
        var cursor: String?
        for _ in 0..<10 {
            let page = try store.tasks(sessionID: "s", state: nil, cursor: cursor, limit: 10)
            seen += page.tasks.map(\.id)
            cursor = page.nextCursor
            if cursor == nil { break }
        }
        #expect(seen == (0..<25).map { "t\($0)" })
    }

    @Test(
        "a page of one state holds that state's tasks only, in creation order, unfinished and final alike",
        arguments: Backend.allCases)
    func pagesByState(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", (0..<6).map { makeTask("t\($0)") })
        for id in ["t1", "t3", "t4"] { _ = try store.startAttempt(id: id) }
        for id in ["t3", "t4"] { _ = try store.finishAttempt(id: id, attempt: 1, bytesTransferred: 10, result: .completed(nil)) }
        func ids(_ state: TaskState) throws -> [String] {
            try store.tasks(sessionID: "s", state: state, cursor: nil, limit: 10).tasks.map(\.id)
        }
        #expect(try ids(.queued) == ["t0", "t2", "t5"])
        #expect(try ids(.running) == ["t1"])
        #expect(try ids(.completed) == ["t3", "t4"])
        #expect(try ids(.failed) == [])
    }

    @Test(
        "the queue as the scheduler loads it: every queued task with its key and own limit, in pages", arguments: Backend.allCases
    )
    func queuedEntries(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        var other = makeTask("other-host", priority: 0.9)
        other.request.url = "http://elsewhere:8080/x"
        other.configurationOverrides = ["max_connections_per_host": 2]
        var held = makeTask("held")
        held.earliestBeginAt = 2_000_000
        _ = try store.createTasks(sessionID: "s", [makeTask("a"), other, held, makeTask("b")])
        let all = try store.queuedEntries(after: 0, limit: 10)
        #expect(all.count == 3)
        #expect(all.map(\.key.host) == ["http://h:80", "http://elsewhere:8080", "http://h:80"])
        #expect(all.map(\.limit) == [nil, 2, nil] && all[1].priority == 0.9)
        let second = try store.queuedEntries(after: all[0].sequence, limit: 1)
        #expect(second.map(\.sequence) == [all[1].sequence])
    }

    @Test("an attempt's end is written only while the task is still in that attempt", arguments: Backend.allCases)
    func attemptGuard(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [makeTask("a")])
        let running = try #require(try store.startAttempt(id: "a"))
        #expect(running.state == .running && running.attempts == 1)
        #expect(try store.startAttempt(id: "a") == nil)
        _ = try store.apply(.cancel, to: "a")
        #expect(try store.finishAttempt(id: "a", attempt: 1, bytesTransferred: 10, result: .completed(nil)) == nil)
        #expect(try store.task(id: "a")?.state == .cancelled)
    }

    @Test(
        "a subscription added, disabled, enabled or deleted changes which events get deliveries at once",
        arguments: Backend.allCases)
    func deliveriesFollowSubscriptions(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        func cancelled(_ id: String) throws {
            _ = try store.createTasks(sessionID: "s", [makeTask(id)])
            _ = try store.apply(.cancel, to: id)
        }
        func pending(_ webhook: String) throws -> Int {
            try store.deliveries(webhookID: webhook, state: nil, cursor: nil, limit: 100).deliveries.count
        }
        try cancelled("before")  // no subscription yet: no delivery, and the writer remembers that
        try store.createWebhook(
            WebhookRecord(id: "w", sessionID: "s", url: "http://h/", events: [.taskCancelled], secret: "k", createdAt: 0))
        try cancelled("added")
        #expect(try pending("w") == 1)
        _ = try store.updateWebhook(id: "w") { $0.enabled = false }
        try cancelled("disabled")
        #expect(try pending("w") == 1)
        _ = try store.updateWebhook(id: "w") { $0.enabled = true }
        try cancelled("enabled")
        #expect(try pending("w") == 2)
        try store.createWebhook(
            WebhookRecord(id: "w2", sessionID: "s", url: "http://h/", events: [.taskCancelled], secret: "k", createdAt: 0))
        try store.deleteWebhook(id: "w")
        try cancelled("deleted")
        #expect(try pending("w2") == 1)
    }

    @Test(
        "a claim made with the copy the engine kept at creation starts the task as it is now (headers changed meanwhile)",
        arguments: Backend.allCases)
    func claimOfAChangedCopy(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        let touched = Locked<[Int64]>([])
        store.observe { changes in touched.withLock { $0 += changes.touched } }
        let copies = try store.createTasks(sessionID: "s", [makeTask("a"), makeTask("b")]).map(\.0)
        _ = try store.updateTask(id: "a") { $0.request.headers = [("Authorization", "Bearer renewed")] }
        #expect(touched.withLock { $0 } == [copies[0].sequence])
        let started = try #require(try waitFor { done in store.startAttempt(copies[0], done: done) })
        #expect(started.request.headers.first?.1 == "Bearer renewed")
        #expect(try store.task(id: "a")?.request.headers.first?.1 == "Bearer renewed")
        // The untouched one starts from its copy.
        let other = try #require(try waitFor { done in store.startAttempt(copies[1], done: done) })
        #expect(other.state == .running && other.request.headers.first?.1 == "Bearer x")
    }

    @Test(
        "an attempt's end written with the copy the engine started from keeps a change made during the attempt",
        arguments: Backend.allCases)
    func endOfAChangedCopy(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [makeTask("a"), makeTask("b")])
        let started = try ["a", "b"].map { id in try #require(try store.startAttempt(id: id)) }
        _ = try store.updateTask(id: "a") { $0.priority = 0.9 }
        let events = try store.events(after: 0, limit: 100).count
        let now = SystemClock().now()
        func end(_ task: TaskRecord) throws -> TaskRecord {
            let history = AttemptRecord(startedAt: now, endedAt: now, bytesTransferred: 7, bytesReceived: 0, outcome: .stopped)
            return try #require(
                try waitFor { done in
                    store.finishAttempt(task, bytesTransferred: 7, end: .completed(nil), history: history, done: done)
                })
        }
        let ended = try end(started[0])
        #expect(ended.state == .completed && ended.priority == 0.9)
        #expect(try store.task(id: "a")?.priority == 0.9)
        let completed = try store.events(after: 0, limit: 100).dropFirst(events).filter { $0.type == "task.completed" }
        #expect(try completed.map { try JSON.parse($0.dataText)["priority"]?.doubleValue } == [0.9])
        // The untouched one ends from its copy, its history written once.
        #expect(try end(started[1]).state == .completed)
        #expect(try store.attempts(taskID: "b")?.count == 1)
    }

    /// It holds the writer with a job of its own and fails another in the same batch, which the
    /// writer then runs again job by job.
    @Test(
        "a claim whose batch is run again after another write in it failed still starts the task as it is now",
        arguments: Backend.allCases)
    func claimInARetriedBatch(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        let copy = try store.createTasks(sessionID: "s", [makeTask("a")])[0].0
        _ = try store.updateTask(id: "a") { $0.request.headers = [("Authorization", "Bearer renewed")] }
        // The writer held by a first job, so that the claim and a failing write share the next batch:
        // it is rolled back and run again job by job, the claim with it.
        let gate = Locked(false)
        store.submitJob { _ in gate.wait(until: { $0 }, timeout: 10) { _ in } }
        let claimed = Locked<Result<TaskRecord?, StoreError>?>(nil)
        store.startAttempt(copy) { result in claimed.withLockNotifyingAll { $0 = result } }
        store.submitJob { _ in throw StoreError.conflict("this write fails") }
        gate.withLockNotifyingAll { $0 = true }
        let result = try #require(claimed.wait(until: { $0 != nil }, timeout: 10) { $0 })
        let started = try #require(try result.get())
        #expect(started.request.headers.first?.1 == "Bearer renewed")
    }

    @Test(
        "group commit: concurrent writes share transactions; each caller returns once its write is on disk",
        arguments: Backend.allCases)
    func groupCommit(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        let commits = Locked(0)
        store.observe { _ in commits.withLock { $0 += 1 } }
        let ids = (0..<64).map { "g\($0)" }
        DispatchQueue.concurrentPerform(iterations: ids.count) { index in
            _ = try? store.createTasks(sessionID: "s", [makeTask(ids[index])])
        }
        for id in ids { #expect(try store.task(id: id)?.state == .queued) }
        #expect(commits.withLock { $0 } <= ids.count)
    }

    @Test("a write that throws undoes only itself; the others in its batch commit", arguments: Backend.allCases)
    func failingWriteInBatch(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [makeTask("dup")])
        DispatchQueue.concurrentPerform(iterations: 8) { index in
            _ = try? store.createTasks(sessionID: "s", [makeTask(index % 2 == 0 ? "dup" : "new\(index)")])
        }
        #expect(
            try store.tasks(sessionID: "s", state: nil, cursor: nil, limit: 100).tasks.map(\.id).sorted()
                == ["dup", "new1", "new3", "new5", "new7"])
    }

    @Test("the change feed reports what entered and left the queue, and what left running", arguments: Backend.allCases)
    func changeFeed(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        let seen = Locked(StoreChanges())
        store.observe { changes in seen.withLock { $0.merge(changes) } }
        _ = try store.createTasks(sessionID: "s", [makeTask("a"), makeTask("b")])
        _ = try store.startAttempt(id: "a")
        _ = try store.apply(.cancel, to: "a")
        _ = try store.apply(.suspend, to: "b")
        let changes = seen.withLock { $0 }
        let a = try #require(try store.task(id: "a")).sequence
        let b = try #require(try store.task(id: "b")).sequence
        #expect(changes.queued.map(\.sequence) == [a, b])
        #expect(changes.unqueued == [a, b])
        #expect(changes.leftRunning == ["a"])
        #expect(changes.eventsAppended && changes.cleanupsAdded == false)
        #expect(!changes.deliveriesAdded)
    }

    /// The webhook dispatcher wakes when deliveries are queued, not for every event: events of a
    /// session whose subscriptions do not want them queue nothing to deliver.
    @Test("the change feed tells deliveries queued apart from events appended", arguments: Backend.allCases)
    func deliveriesInTheChangeFeed(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        let seen = Locked<[StoreChanges]>([])
        store.observe { changes in seen.withLock { $0.append(changes) } }
        try store.createWebhook(
            WebhookRecord(id: "w", sessionID: "s", url: "http://h/", events: [.taskCancelled], secret: "k", createdAt: 0))
        func cancel(_ id: String) throws -> StoreChanges {
            _ = try store.createTasks(sessionID: "s", [makeTask(id)])
            seen.withLock { $0.removeAll() }
            _ = try store.apply(.cancel, to: id)
            return seen.withLock { $0.reduce(into: StoreChanges()) { $0.merge($1) } }
        }
        let wanted = try cancel("wanted")
        #expect(wanted.eventsAppended && wanted.deliveriesAdded)
        _ = try store.updateWebhook(id: "w") { $0.events = [.taskCompleted] }
        let unwanted = try cancel("unwanted")
        #expect(unwanted.eventsAppended && !unwanted.deliveriesAdded)
    }

    @Test("a savepoint that throws undoes only its own changes")
    func savepoint() throws {
        let db = try Connection(path: ":memory:")
        try db.execute("CREATE TABLE t (x)")
        struct Refused: Error {}
        try db.transaction {
            _ = try db.savepoint { try db.run("INSERT INTO t VALUES (1)") }
            #expect(throws: Refused.self) {
                try db.savepoint {
                    try db.run("INSERT INTO t VALUES (2)")
                    throw Refused()
                }
            }
            _ = try db.savepoint { try db.run("INSERT INTO t VALUES (3)") }
        }
        #expect(try db.query("SELECT x FROM t ORDER BY x", []) { $0.int(0) } == [1, 3])
        #expect(!db.inTransaction)
    }

    @Test("cached statements are found by their whole text: texts of one length that differ anywhere stay apart")
    func statementCache() throws {
        let db = try Connection(path: ":memory:")
        try db.execute("CREATE TABLE t (x)")
        // Same length, same first and last bytes: the cache's key must still tell them apart.
        let texts = (0..<40).map { "SELECT \(String(format: "%03d", $0)) + x FROM t -- \(String(repeating: "p", count: 40))" }
        try db.run("INSERT INTO t VALUES (1000)")
        for round in 0..<2 {
            for (index, sql) in texts.enumerated() {
                #expect(try db.queryFirst(sql) { $0.int(0) } == Int64(1000 + index), "round \(round)")
            }
        }
    }

    @Test("bound text and blobs read back as bound, whatever their size, the statement reused; an empty text is not NULL")
    func boundArguments() throws {
        let db = try Connection(path: ":memory:")
        let sql = "SELECT ?, ?, length(?), ? IS NULL, typeof(?)"
        for size in [0, 3, 300, 70_000, 5] {
            let text = String(repeating: "é", count: size)
            let blob = [UInt8](repeating: 7, count: size * 2)
            let row = try #require(
                try db.queryFirst(sql, [text, "b\(size)", SQLValue.blob(blob), "", SQLValue.blob(blob)]) {
                    ($0.string(0), $0.string(1), $0.int(2), $0.int(3), $0.string(4))
                })
            #expect(row.0 == text && row.1 == "b\(size)" && row.2 == Int64(size * 2) && row.3 == 0 && row.4 == "blob")
        }
    }

    @Test("tasks shown running without a transfer go back to the queue, their attempt not counted", arguments: Backend.allCases)
    func orphans(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [makeTask("a"), makeTask("b")])
        _ = try store.startAttempt(id: "a")
        _ = try store.startAttempt(id: "b")
        #expect(try store.requeueRunning(except: ["a"]) == 1)
        #expect(try store.task(id: "a")?.state == .running)
        #expect(try store.task(id: "b")?.state == .queued)
        #expect(try store.task(id: "b")?.attempts == 0)
    }

    @Test("interrupted tasks go back to the queue after a crash", arguments: Backend.allCases)
    func recovery(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [makeTask("a"), makeTask("b")])
        _ = try store.startAttempt(id: "a")
        _ = try store.startAttempt(id: "b")
        _ = try store.finishAttempt(id: "b", attempt: 1, bytesTransferred: 10, result: .completed(nil))
        #expect(try store.recoverInterrupted().requeued == 1)
        #expect(try store.task(id: "a")?.state == .queued)
        #expect(try store.task(id: "a")?.attempts == 1)
        #expect(try store.task(id: "b")?.state == .completed)
    }

    @Test("timers: retries and scheduled starts come due; deadlines fail -1001", arguments: Backend.allCases)
    func timers(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        var scheduled = makeTask("later")
        scheduled.earliestBeginAt = clock.now() + 10
        _ = try store.createTasks(
            sessionID: "s", [makeTask("retry"), scheduled, makeTask("expiring", deadline: clock.now() + 20)])
        _ = try store.startAttempt(id: "retry")
        _ = try store.finishAttempt(
            id: "retry", attempt: 1, bytesTransferred: 0,
            result: .retry(at: clock.now() + 5, TaskError(.timedOut, message: "t"), nil))
        #expect(try store.nextTimer() == clock.now() + 5)
        clock.advance(6)
        #expect(try store.fireTimers(now: clock.now()).expired == 0)
        #expect(try store.task(id: "retry")?.state == .queued)
        #expect(try store.task(id: "later")?.state == .waiting)
        clock.advance(5)
        _ = try store.fireTimers(now: clock.now())
        #expect(try store.task(id: "later")?.state == .queued)
        clock.advance(10)
        #expect(try store.fireTimers(now: clock.now()).expired == 1)
        #expect(try store.task(id: "expiring")?.error?.code == -1001)
    }

    @Test("events are written with the state changes, and session.drained once at the end", arguments: Backend.allCases)
    func events(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [makeTask("a"), makeTask("b")])
        _ = try store.startAttempt(id: "a")
        _ = try store.finishAttempt(id: "a", attempt: 1, bytesTransferred: 10, result: .completed(nil))
        _ = try store.apply(.cancel, to: "b")
        let types = try store.events(after: 0).map(\.type)
        #expect(types == ["task.completed", "task.cancelled", "session.drained"])
        let completed = try #require(try store.events(after: 0).first)
        #expect(completed.payload["data"]?["request"]?["headers"]?["Authorization"] == "[redacted]")
    }

    @Test("the schema survives reopening a file database, WAL mode on")
    func reopen() throws {
        let path = "/tmp/backhaul-store-test-\(getpid()).db"
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        do {
            let first = try Store(path: path)
            _ = try first.putSession(id: "s", configuration: TransferConfiguration())
            _ = try first.createTasks(sessionID: "s", [makeTask("a")])
        }
        let second = try Store(path: path)
        #expect(try second.task(id: "a")?.state == .queued)
        #expect(second.isWritable())
    }
}

@Suite("Store cleanups")
struct StoreCleanupTests {
    let clock = ManualClock()

    func s3Task(_ id: String) -> TaskRecord {
        var task = makeTask(id)
        task.file.size = 12 << 20
        task.request = RequestSpec(url: "http://127.0.0.1:9/bucket/dir/\(id).bin", method: "PUT")
        task.upload = UploadSpec(protocolName: .s3)
        task.upload.chunkSize = 5 << 20
        task.upload.s3 = S3Credentials(region: "us-east-1", accessKeyID: "AKIA", secretAccessKey: "secret")
        return task
    }

    @Test(
        "cancelling an S3 task that ran queues its release in the same transaction, signed; one that never ran queues none",
        arguments: Backend.allCases)
    func s3CancelQueuesRelease(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [s3Task("ran"), s3Task("never")])
        _ = try store.startAttempt(id: "ran")
        _ = try store.apply(.cancel, to: "ran")
        _ = try store.apply(.cancel, to: "never")
        let due = try store.dueCleanups(now: clock.now(), limit: 10, excluding: [])
        #expect(due.count == 1)
        let plan = try #require(try due.first?.plan.get())
        #expect(plan.request.method == "GET" && plan.request.url == "http://127.0.0.1:9/bucket?prefix=dir&uploads=")
        #expect(plan.request.signing?.secretAccessKey == "secret")
        #expect(plan.abortListedUploads == "dir/ran.bin")
    }

    @Test("a cleanup row that cannot be read comes back as a failure, not skipped", arguments: Backend.allCases)
    func unreadableCleanup(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [s3Task("ran")])
        _ = try store.startAttempt(id: "ran")
        _ = try store.apply(.cancel, to: "ran")
        try store.plant("UPDATE cleanups SET request = 'not json'")
        let due = try store.dueCleanups(now: clock.now(), limit: 10, excluding: [])
        #expect(due.count == 1)
        #expect(throws: StoreError.self) { try due.first?.plan.get() }
    }

    @Test("a listed upload another unfinished task holds is not aborted", arguments: Backend.allCases)
    func listedUploadHeldByAnotherTask(_ backend: Backend) throws {
        let store = try backend.openWithSession(clock: clock)
        defer { store.close() }
        _ = try store.createTasks(sessionID: "s", [s3Task("ran"), s3Task("other")])
        _ = try store.startAttempt(id: "other")
        store.saveCheckpoint(
            sequence: try #require(try store.task(id: "other")).sequence, attempt: 1,
            TransferCheckpoint(offset: 0, location: "held-id"))
        try store.settle()
        _ = try store.startAttempt(id: "ran")
        _ = try store.apply(.cancel, to: "ran")
        let due = try store.dueCleanups(now: clock.now(), limit: 10, excluding: [])
        let plan = try #require(try due.first?.plan.get())
        let abort = { (id: String) in
            (
                uploadID: id,
                plan: CleanupPlan(
                    request: PlannedRequest(
                        method: "DELETE", url: "http://x/\(id)",
                        headers: [], body: .empty))
            )
        }
        #expect(try store.replaceCleanup(sequence: due[0].sequence, with: [abort("held-id"), abort("orphan")]) == 1)
        let next = try store.dueCleanups(now: clock.now(), limit: 10, excluding: [])
        #expect(try next.map { try $0.plan.get().request.url } == ["http://x/orphan"])
        _ = plan
    }
}

@Suite("Store refuses what it cannot read")
struct StoreCorruptionTests {
    @Test("a task row with an unknown state or kind is an error, never a default", arguments: Backend.allCases)
    func unknownStateOrKind(_ backend: Backend) throws {
        let store = try backend.open()
        defer { store.close() }
        _ = try store.putSession(id: "s", configuration: TransferConfiguration())
        _ = try store.createTasks(sessionID: "s", [makeTask("a"), makeTask("b")])
        try store.plant("UPDATE tasks SET state = 'paused' WHERE id = 'a'")
        try store.plant("UPDATE tasks SET kind = 'sync' WHERE id = 'b'")
        #expect(throws: StoreError.corrupt("task a has kind upload and state paused")) { try store.task(id: "a") }
        #expect(throws: StoreError.corrupt("task b has kind sync and state queued")) { try store.task(id: "b") }
    }

    @Test("opening a database with tasks in an unknown state is refused")
    func unknownStateAtOpen() throws {
        let path = "/tmp/backhaul-store-\(getpid())-\(Int.random(in: 0..<1_000_000)).db"
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        do {
            let store = try Store(path: path)
            _ = try store.putSession(id: "s", configuration: TransferConfiguration())
            _ = try store.createTasks(sessionID: "s", [makeTask("a")])
            // As a build that knows such a state would leave it: in the rows and in the counts.
            try store.write { db in
                try db.run("UPDATE tasks SET state = 'paused'")
                try db.run("UPDATE session_counts SET state = 'paused' WHERE state = 'queued'")
            }
        }
        #expect(throws: StoreError.self) { _ = try Store(path: path) }
    }
}

@Suite("Store quota")
struct StoreQuotaTests {
    /// Found by the v1 state fixture: a task created cancelled by the quota was answered with
    /// reason 2 and error -999, but its row kept neither, so reading it back showed nulls.
    @Test("a task created cancelled by the session's quota reads back with its reason and error", arguments: Backend.allCases)
    func quotaCancellationIsStored(_ backend: Backend) throws {
        let store = try backend.open()
        defer { store.close() }
        var configuration = TransferConfiguration()
        configuration.quotaBytes = 15
        _ = try store.putSession(id: "s", configuration: configuration)
        let created = try store.createTasks(sessionID: "s", [makeTask("a"), makeTask("b")])
        #expect(created[1].0.cancellation == .insufficientSystemResources)
        let stored = try #require(try store.task(id: "b"))
        #expect(stored.state == .cancelled && stored.cancellation == .insufficientSystemResources)
        #expect(stored.error?.code == -999 && stored.finishedAt != nil)
    }
}

@Suite("Store upkeep")
struct StoreUpkeepTests {
    static let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("fixtures/state-v1/backhaul.db").path

    func scratchCopy(_ name: String) throws -> String {
        let path = "/tmp/backhaul-\(name)-\(getpid())-\(Int.random(in: 0..<1_000_000)).db"
        let data = try #require(FileManager.default.contents(atPath: Self.fixture))
        _ = FileManager.default.createFile(atPath: path, contents: data)
        return path
    }

    func version(_ path: String) throws -> Int64 {
        let db = try Connection(path: path)
        return try db.queryFirst("PRAGMA user_version") { $0.int(0) } ?? -1
    }

    @Test("a migration that fails leaves the old database as it was and its backup beside it; the next start migrates")
    func migrationBackup() throws {
        let path = try scratchCopy("migrate")
        defer { for suffix in ["", "-wal", "-shm", ".v5.backup"] { unlink(path + suffix) } }
        #expect(try version(path) == 5)
        // Break migration 6 (it replaces this index).
        try Connection(path: path).execute("DROP INDEX tasks_idempotency")
        #expect(throws: (any Error).self) { _ = try Store(path: path) }
        #expect(try version(path) == 5, "nothing of the failed migration stays")
        #expect(FileManager.default.fileExists(atPath: path + ".v5.backup"), "the copy is kept")
        try Connection(path: path).execute(
            "CREATE UNIQUE INDEX tasks_idempotency ON tasks (session_id, idempotency_key) WHERE idempotency_key IS NOT NULL")
        let store = try Store(path: path)
        #expect(try store.sessions().count == 5)
        store.close()
        #expect(try version(path) == Int64(Migrator(migrations: Schema.migrations).latest))
        #expect(!FileManager.default.fileExists(atPath: path + ".v5.backup"), "removed once every migration committed")
    }

    /// Migration 10 keeps no index keyed by state on the path of every task; what reads a
    /// session's unfinished tasks must still go through the partial index, not the session's
    /// whole history, and the finished-task queries must still be able to use theirs.
    @Test("a session's unfinished tasks are read through tasks_open; finished ones through tasks_finished")
    func queryPlans() throws {
        let path = "/tmp/backhaul-plans-\(getpid()).db"
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        try Store(path: path).close()
        let db = try Connection(path: path)
        func plan(_ sql: String) throws -> String {
            try db.query("EXPLAIN QUERY PLAN " + sql) { $0.string(3) }.joined(separator: "; ")
        }
        #expect(try plan("SELECT SUM(file_size) FROM tasks WHERE \(Store.openInSession)").contains("tasks_open"))
        #expect(try plan("SELECT id FROM tasks WHERE \(Store.openInSession) ORDER BY seq").contains("tasks_open"))
        let page = "SELECT id FROM tasks WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        #expect(try plan(page).contains("tasks_by_session"))
        #expect(
            try plan(
                "SELECT MIN(finished_at) FROM tasks INDEXED BY tasks_finished WHERE finished_at IS NOT NULL AND \(StoreRules.finalCondition)"
            ).contains("tasks_finished"))
        let store = try Store(path: path)
        #expect(try store.oldestFinishedTask(now: 0) == nil)
        #expect(try store.pruneFinishedTasks(defaultRetention: 0) == 0)
        store.close()
    }

    @Test("a database newer than this build is refused untouched")
    func newerRefused() throws {
        let path = try scratchCopy("newer")
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        try Connection(path: path).execute("PRAGMA user_version = 999")
        #expect(throws: StoreError.newerSchema(found: 999, supported: Migrator(migrations: Schema.migrations).latest)) {
            _ = try Store(path: path)
        }
        #expect(try version(path) == 999)
    }

    /// SQLite's own checkpoint is PASSIVE: while readers keep a snapshot it cannot reset the WAL,
    /// which grows. The writer's TRUNCATE checkpoint waits for the short reads and empties it.
    @Test("the WAL stays bounded while readers are busy", arguments: [true, false])
    func walBounded(truncating: Bool) throws {
        let path = "/tmp/backhaul-wal-\(getpid())-\(truncating).db"
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        var policy = WALPolicy()
        policy.pauseFrames = 100
        policy.capFrames = truncating ? 400 : .max / 8192
        let store = try Store(path: path, walPolicy: policy)
        _ = try store.putSession(id: "s", configuration: TransferConfiguration())
        let stop = Locked(false)
        let readers = DispatchGroup()
        for _ in 0..<3 {
            readers.enter()
            Thread.detachNewThread {
                while !stop.withLock({ $0 }) { _ = try? store.tasks(sessionID: "s", state: nil, cursor: nil, limit: 50) }
                readers.leave()
            }
        }
        var largest: Int64 = 0
        for batch in 0..<150 {
            _ = try store.createTasks(sessionID: "s", (0..<20).map { makeTask("w\(batch)-\($0)") })
            let size = (try? FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? NSNumber)??.int64Value ?? 0
            largest = max(largest, size)
        }
        stop.withLock { $0 = true }
        readers.wait()
        let figures = store.maintenanceFigures
        print(
            "WAL with readers busy, \(truncating ? "TRUNCATE past 400 frames" : "PASSIVE only"): largest \(largest) bytes; "
                + "\(figures.truncateCheckpoints) truncating, \(figures.passiveCheckpoints) passive, \(figures.checkpointsBusy) held back"
        )
        if truncating {
            #expect(figures.truncateCheckpoints > 0)
            #expect(largest < 8 << 20, "the WAL reached \(largest) bytes")
        }
        store.close()
    }
}

@Suite("The tasks table has one writer")
struct TaskRowsOnlyTests {
    static let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Sources")

    /// The engine's queue, the session counts and the claim's re-read hear of a task's change from
    /// `TaskRows` (`TaskFeed`): SQL that wrote `tasks` anywhere else would change a task unheard.
    @Test("no SQL outside TaskRows+SQLite.swift inserts, updates or deletes tasks")
    func onlyTaskRowsWritesTasks() throws {
        let pattern = try Regex(
            #"(?i)(INSERT\s+(OR\s+\w+\s+)?INTO|REPLACE\s+INTO|UPDATE(\s+OR\s+\w+)?|DELETE\s+FROM)\s+(main\.)?["`]?tasks\b"#)
        var files = 0
        var offenders: [String] = []
        let walker = FileManager.default.enumerator(at: Self.sources, includingPropertiesForKeys: nil)
        while let url = walker?.nextObject() as? URL {
            // The PostgreSQL queue's `tasks` is another database's table (docs/fleet.md).
            guard url.pathExtension == "swift", !url.path.contains("/Sources/BackhaulPostgres/") else { continue }
            files += 1
            let text = try String(contentsOf: url, encoding: .utf8)
            if url.lastPathComponent != "TaskRows+SQLite.swift", text.contains(pattern) {
                offenders.append(url.lastPathComponent)
            }
        }
        #expect(files > 100)
        #expect(offenders == [])
        // The pattern finds what it must: TaskRows itself inserts, updates (four statements) and deletes.
        let rows = try String(
            contentsOf: Self.sources.appendingPathComponent("BackhaulSQLite/TaskRows+SQLite.swift"), encoding: .utf8)
        #expect(rows.matches(of: pattern).count == 6)
        for statement in ["UPDATE OR IGNORE tasks SET", "replace into \"tasks\"", "DELETE FROM main.tasks"] {
            #expect(statement.contains(pattern), "\(statement)")
        }
    }
}

@Suite("Durable writes")
struct DurableWriteTests {
    /// A completed task's source file (`delete_file_on_success`) is removed only once the commit
    /// that completed it is on disk: its end is a relaxed write, which a power loss could undo, and
    /// the file cannot come back.
    @Test("a relaxed write that completes a delete-on-success task syncs the WAL before the file goes")
    func fileRemovedAfterSync() throws {
        let store = try Store(path: ":memory:")
        defer { store.close() }
        store.removeFiles(with: RemoverByPath())
        _ = try store.putSession(id: "s", configuration: TransferConfiguration())
        let path = "/tmp/backhaul-delete-\(getpid())-\(UUID().uuidString)"
        #expect(FileManager.default.createFile(atPath: path, contents: Data("x".utf8)))
        defer { unlink(path) }
        var task = makeTask("del")
        task.file = FileInfo(path: path, size: 1, modifiedAtNanoseconds: 1)
        task.deleteFileOnSuccess = true
        _ = try store.createTasks(sessionID: "s", [task])
        _ = try store.startAttempt(id: "del")
        let syncs = store.writer.walSyncs.withLock { $0 }
        #expect(try store.finishAttempt(id: "del", attempt: 1, bytesTransferred: 1, result: .completed(nil))?.state == .completed)
        #expect(!FileManager.default.fileExists(atPath: path))
        #expect(store.writer.walSyncs.withLock { $0 } > syncs)
    }

    /// The engine's commits need no sync: the writer acts on them itself when nothing is before
    /// them, without a hand-over to the settler thread; behind a durable write they wait for it.
    @Test("a relaxed write is settled by the writer when nothing is before it; behind durable writes in commit order")
    func relaxedSettledByWriter() throws {
        let store = try Store(path: ":memory:")
        defer { store.close() }
        let settledOn = Locked<String?>(nil)
        store.submit({ db in try db.run("INSERT INTO settings (key, value) VALUES ('alone', '1')") }) { _ in
            let name = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? "?"
            settledOn.withLockNotifyingAll { $0 = name.trimmingCharacters(in: .whitespacesAndNewlines) }
        }
        #expect(settledOn.wait(until: { $0 != nil }, timeout: 10) { $0 } == "bh-writer")

        let order = Locked<[Int]>([])
        let durable = (0..<4).map { thread in
            let worker = WorkerThread(name: "test-worker")
            worker.start {
                for index in 0..<25 {
                    _ = try? store.write { db in
                        try db.run("INSERT INTO settings (key, value) VALUES (?, '1')", ["d\(thread)-\(index)"])
                    }
                }
            }
            return worker
        }
        for index in 0..<400 {
            store.submit({ db in try db.run("INSERT INTO settings (key, value) VALUES (?, '1')", ["r\(index)"]) }) { _ in
                order.withLockNotifyingAll { $0.append(index) }
            }
        }
        for thread in durable { thread.join() }
        #expect(order.wait(until: { $0.count == 400 }, timeout: 10) { $0 } == Array(0..<400))
    }

    /// Commits do not wait for the disk: the writer's settler syncs the WAL before a durable write
    /// is answered (one `fdatasync` for all that committed by then), and relaxed writes cost none.
    @Test("a durable write returns only after a sync of the WAL that followed its commit; relaxed writes cause no sync")
    func answeredAfterSync() throws {
        let store = try Store(path: ":memory:")
        defer { store.close() }
        let syncs: @Sendable () -> Int = { store.writer.walSyncs.withLock { $0 } }
        let start = syncs()
        for index in 0..<20 {
            try store.write(.relaxed) { db in try db.run("INSERT INTO settings (key, value) VALUES (?, '1')", ["r\(index)"]) }
        }
        #expect(syncs() == start)
        let late = Locked(0)
        let threads = (0..<8).map { thread in
            let worker = WorkerThread(name: "test-worker")
            worker.start {
                for index in 0..<25 {
                    let before = syncs()
                    _ = try? store.write { db in
                        try db.run("INSERT INTO settings (key, value) VALUES (?, '1')", ["d\(thread)-\(index)"])
                    }
                    if syncs() <= before { late.withLock { $0 += 1 } }
                }
            }
            return worker
        }
        for thread in threads { thread.join() }
        #expect(late.withLock { $0 } == 0)
        // Group commit: fewer syncs than durable writes, and every one of them stored.
        #expect(syncs() - start <= 200)
        let stored = try store.read { db in try db.queryFirst("SELECT COUNT(*) FROM settings WHERE key LIKE 'd%'") { $0.int(0) } }
        #expect(stored == 200)
    }
}
