import BackhaulCore
import Testing

@Suite("Scheduler")
struct SchedulerTests {
    static let a = Scheduler.Key(session: "s", host: "http://a:80")
    static let b = Scheduler.Key(session: "s", host: "http://b:80")
    static let other = Scheduler.Key(session: "t", host: "http://a:80")

    func entry(_ sequence: Int64, _ priority: Double = 0.5, _ key: Scheduler.Key = a, limit: Int? = nil) -> Scheduler.Entry {
        Scheduler.Entry(sequence: sequence, priority: priority, key: key, limit: limit)
    }

    /// Takes everything startable, starting each as it goes.
    func drain(_ scheduler: inout Scheduler) -> [Int64] {
        var started: [Int64] = []
        while let next = scheduler.next() {
            scheduler.started(next.key)
            started.append(next.sequence)
        }
        return started
    }

    @Test("priority first, then creation order, across sessions and hosts")
    func order() {
        var scheduler = Scheduler()
        scheduler.setLimit(session: "s", 100)
        scheduler.setLimit(session: "t", 100)
        for item in [entry(1, 0.1), entry(2, 0.9, Self.b), entry(3), entry(4, 0.5, Self.other), entry(5, 0.9)] {
            scheduler.enqueue(item)
        }
        #expect(drain(&scheduler) == [2, 5, 3, 4, 1])
    }

    /// Rows: (session limit, own limits, running before) → what starts.
    @Test(
        "per-key limits: the session's max_connections_per_host, a task's own limit, what already runs",
        arguments: [
            (2, [nil, nil, nil], 0, [1, 2] as [Int64]),
            (2, [nil, nil, nil], 1, [1]),
            (2, [nil, nil, nil], 2, []),
            // A task's own limit (3) lets it start beside one already running; the next, under the
            // session's limit of 1, waits.
            (1, [3, nil, nil], 1, [1]),
            (1, [nil, 3, nil], 0, [1, 2]),
            (5, [1, nil, nil], 1, []),
        ] as [(Int, [Int?], Int, [Int64])])
    func limits(sessionLimit: Int, own: [Int?], running: Int, expected: [Int64]) {
        var scheduler = Scheduler()
        scheduler.setLimit(session: "s", sessionLimit)
        for (index, limit) in own.enumerated() { scheduler.enqueue(entry(Int64(index + 1), 0.5, Self.a, limit: limit)) }
        for _ in 0..<running { scheduler.started(Self.a) }
        var started: [Int64] = []
        while let next = scheduler.next() {
            scheduler.started(next.key)
            started.append(next.sequence)
        }
        #expect(started == expected, "session \(sessionLimit), own \(own), running \(running)")
    }

    @Test("a saturated key holds back only its own tasks, and shows as saturated")
    func saturation() {
        var scheduler = Scheduler()
        scheduler.setLimit(session: "s", 1)
        scheduler.enqueue(entry(1, 0.9))
        scheduler.enqueue(entry(2, 0.9))
        scheduler.enqueue(entry(3, 0.1, Self.b))
        #expect(drain(&scheduler) == [1, 3])
        #expect(scheduler.saturatedKeys() == [Self.a])
        scheduler.ended(Self.a)
        #expect(scheduler.saturatedKeys().isEmpty)
        #expect(drain(&scheduler) == [2])
        #expect(scheduler.queuedCount == 0)
    }

    @Test("leaving the queue, changing priority or host, entering again")
    func changes() {
        var scheduler = Scheduler()
        scheduler.setLimit(session: "s", 10)
        for sequence: Int64 in 1...4 { scheduler.enqueue(entry(sequence)) }
        scheduler.dequeue(2)
        scheduler.enqueue(entry(4, 0.8))
        scheduler.enqueue(entry(3, 0.5, Self.b))
        scheduler.dequeue(99)
        #expect(scheduler.queuedCount == 3 && !scheduler.isQueued(2))
        #expect(drain(&scheduler) == [4, 1, 3])
        #expect(scheduler.running(Self.a) == 2 && scheduler.running(Self.b) == 1)
    }

    @Test("a given-back entry runs again in its place; stale heap entries are compacted away")
    func givenBackAndCompaction() {
        var scheduler = Scheduler()
        scheduler.setLimit(session: "s", 1)
        for sequence: Int64 in 1...200 { scheduler.enqueue(entry(sequence, Double(sequence % 7) / 10)) }
        for sequence: Int64 in 1...150 { scheduler.dequeue(sequence) }
        let first = scheduler.next()
        #expect(first != nil)
        if let first { scheduler.enqueue(first) }
        #expect(scheduler.queuedCount == 50)
        var order: [Int64] = []
        while let next = scheduler.next() { order.append(next.sequence) }
        let expected = (151...200).map { Int64($0) }.sorted { ($0 % 7, -$0) > ($1 % 7, -$1) }
        #expect(order == expected)
    }
}
