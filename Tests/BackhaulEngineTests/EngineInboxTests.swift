import BackhaulQueue
import Foundation
import Testing
import Threads

@testable import BackhaulEngine

@Suite("The engine's inbox")
struct EngineInboxTests {
    @Test("a post into an empty inbox wakes the loop; posts before it takes them do not; after the take, one wakes again")
    func wakesWhenItFills() {
        let wakes = Locked(0)
        let inbox = EngineInbox { wakes.withLock { $0 += 1 } }
        inbox.post { _ in }
        inbox.post(StoreChanges())
        inbox.requestPolicyReview()
        #expect(wakes.withLock { $0 } == 1)
        let taken = inbox.take()
        #expect(taken.items.count == 2 && taken.policyReview)
        inbox.requestPolicyReview()
        #expect(wakes.withLock { $0 } == 2)
        inbox.post { _ in }
        #expect(wakes.withLock { $0 } == 2)
        _ = inbox.take()
        #expect(inbox.take().items.isEmpty)
        inbox.post { _ in }
        #expect(wakes.withLock { $0 } == 3)
    }

    /// Four threads post while a loop takes a turn at each wake, as the curl loop does: a wake
    /// that came while it was awake makes it turn again. Every post is taken, and the loop never
    /// sleeps with posts waiting (a lost wake would leave it waiting for the deadline).
    @Test("under concurrent posts every item is taken after some wake, none left waiting")
    func noLostWake() throws {
        let pending = Locked(0)
        let wakes = Locked(0)
        let inbox = EngineInbox {
            wakes.withLock { $0 += 1 }
            pending.withLockNotifyingAll { $0 += 1 }
        }
        let posters = 4
        let perPoster = 20_000
        let group = DispatchGroup()
        for _ in 0..<posters {
            DispatchQueue.global().async(group: group) {
                for _ in 0..<perPoster { inbox.post { _ in } }
            }
        }
        var taken = 0
        var turns = 0
        while taken < posters * perPoster {
            let woken = pending.wait(until: { $0 > 0 }, timeout: 10) { unseen -> Bool in
                defer { unseen = 0 }
                return unseen > 0
            }
            try #require(woken, "the loop slept with \(posters * perPoster - taken) posts not taken")
            taken += inbox.take().items.count
            turns += 1
        }
        group.wait()
        #expect(taken == posters * perPoster)
        #expect(inbox.take().items.isEmpty)
        #expect(wakes.withLock { $0 } < taken, "posts share wake-ups (\(turns) turns)")
    }
}
