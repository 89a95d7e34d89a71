import BackhaulCore
import Foundation
import Testing
import Threads

@testable import BackhaulQueue
@testable import BackhaulSQLite

/// The engine holds its writes back for a turn (`Store.holdWrites`) so that a turn's ends and
/// claims go into one transaction.
@Suite("Held writes")
struct WriteHoldTests {
    let store: Store

    init() throws {
        store = try Store(path: ":memory:")
        _ = try store.putSession(id: "s", configuration: TransferConfiguration())
        _ = try store.createTasks(sessionID: "s", (0..<6).map { makeTask("h\($0)") })
    }

    @Test("a thread's held writes wait for its release and then commit together; other threads' do not wait")
    func heldTogether() throws {
        let commits = Locked(0)
        store.observe { _ in commits.withLock { $0 += 1 } }
        let claimed = Locked<[String]>([])
        store.holdWrites()
        defer { store.releaseWrites() }
        for index in 0..<6 {
            let task = try #require(try store.task(id: "h\(index)"))
            store.startAttempt(task) { result in
                if case .success(let started?) = result { claimed.withLockNotifyingAll { $0.append(started.id) } }
            }
        }
        // Another thread's write goes through meanwhile.
        let other = Locked(false)
        Thread.detachNewThread {
            _ = try? store.createTasks(sessionID: "s", [makeTask("other")])
            other.withLockNotifyingAll { $0 = true }
        }
        #expect(other.wait(until: { $0 }, timeout: 10) { $0 })
        #expect(claimed.withLock { $0 }.isEmpty, "held: nothing of them committed")
        let before = commits.withLock { $0 }
        store.releaseWrites()
        #expect(claimed.wait(until: { $0.count == 6 }, timeout: 10) { $0.count } == 6)
        #expect(commits.withLock { $0 } == before + 1, "one transaction for the six")
    }

    /// The engine thread writes synchronously too (a cleanup's result) while it holds: that write
    /// must not wait behind its own held ones (it would wait for ever), and must not overtake them.
    @Test("a held thread's waited-for write takes the held ones with it, in order, and returns")
    func waitedForWrite() throws {
        let task = try #require(try store.task(id: "h0"))
        let returned = Locked<Int?>(nil)
        Thread.detachNewThread { [store] in
            store.holdWrites()
            store.startAttempt(task) { _ in }
            // Runs after the claim in the same order: it sees the task running.
            let state = try? store.write { db in
                try db.queryFirst("SELECT state FROM tasks WHERE id = 'h0'") { $0.string(0) }
            }
            store.releaseWrites()
            returned.withLockNotifyingAll { $0 = state == "running" ? 1 : 0 }
        }
        #expect(returned.wait(until: { $0 != nil }, timeout: 10) { $0 } == 1)
    }

    /// A store closed while a thread holds writes (the engine stopping inside a turn) writes
    /// them before it closes: an accepted write is not dropped.
    @Test("writes held when the store closes are written, not dropped")
    func heldAtClose() throws {
        let path = "/tmp/backhaul-hold-test-\(getpid()).db"
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        let ended = Locked<Bool?>(nil)
        do {
            let store = try Store(path: path)
            _ = try store.putSession(id: "s", configuration: TransferConfiguration())
            _ = try store.createTasks(sessionID: "s", [makeTask("c")])
            let task = try #require(try store.task(id: "c"))
            store.holdWrites()
            store.startAttempt(task) { result in
                let started: Bool
                if case .success(.some) = result { started = true } else { started = false }
                ended.withLockNotifyingAll { $0 = started }
            }
            store.close()
        }
        #expect(ended.wait(until: { $0 != nil }, timeout: 5) { $0 } == true)
        #expect(try Store(path: path).task(id: "c")?.state == .running)
    }

    /// Only the holding thread's release hands its writes over: another thread's release (a
    /// thread that does not hold) must not commit them behind the holder's back.
    @Test("a release from a thread that does not hold hands over nothing")
    func releaseByAnotherThread() throws {
        let task = try #require(try store.task(id: "h1"))
        let claimed = Locked(false)
        store.holdWrites()
        store.startAttempt(task) { result in
            if case .success(.some) = result { claimed.withLockNotifyingAll { $0 = true } }
        }
        let released = Locked(false)
        Thread.detachNewThread { [store] in
            store.releaseWrites()
            released.withLockNotifyingAll { $0 = true }
        }
        #expect(released.wait(until: { $0 }, timeout: 10) { $0 })
        // A write of another thread (the holder's own would take the held ones along) that
        // commits after that release: the claim would be in its batch or an earlier one had the
        // release handed it over.
        let probed = Locked(false)
        Thread.detachNewThread { [store] in
            _ = try? store.createTasks(sessionID: "s", [makeTask("after")])
            probed.withLockNotifyingAll { $0 = true }
        }
        #expect(probed.wait(until: { $0 }, timeout: 10) { $0 })
        #expect(!claimed.withLock { $0 }, "still held")
        store.releaseWrites()
        #expect(claimed.wait(until: { $0 }, timeout: 10) { $0 })
    }
}
