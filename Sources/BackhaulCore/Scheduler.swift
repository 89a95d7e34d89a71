/// Which queued tasks start next (OpenAPI/backhaul.yaml `max_connections_per_host`, §2.2 `priority`):
/// higher priority first, then creation order, whatever the session; at most the limit running
/// per (session, host) key. Pure: the engine tells it what entered or left the queue and what it
/// started and ended, and asks for the next task to start.
///
/// Fairness is creation order at equal priority: a session with a deep queue does not hold back
/// another's older or higher-priority tasks, and a saturated host holds back only its own key.
/// Picking scans the keys that have work and room (few in practice: sessions × hosts).
public struct Scheduler: Sendable {
    /// One session's transfers to one `scheme://host:port`.
    public struct Key: Hashable, Sendable, CustomStringConvertible {
        public var session: String
        public var host: String

        public init(session: String, host: String) {
            self.session = session
            self.host = host
        }

        public var description: String { session + " " + host }
    }

    /// A queued task as the scheduler sees it.
    public struct Entry: Sendable, Equatable {
        public var sequence: Int64
        public var priority: Double
        public var key: Key
        /// The task's own `max_connections_per_host`, when it overrides its session's.
        public var limit: Int?

        public init(sequence: Int64, priority: Double, key: Key, limit: Int? = nil) {
            self.sequence = sequence
            self.priority = priority
            self.key = key
            self.limit = limit
        }
    }

    /// What is kept per queued task (the key as an index into `keys`).
    private struct Slot: Sendable {
        var key: Int32
        var priority: Double
        var limit: Int32
    }

    /// A heap element; stale once its task left the queue or changed priority or key.
    private struct Ranked: Sendable {
        var priority: Double
        var sequence: Int64

        /// Runs before `other`: higher priority, then older.
        func precedes(_ other: Ranked) -> Bool {
            priority != other.priority ? priority > other.priority : sequence < other.sequence
        }
    }

    private struct Lane: Sendable {
        var key: Key
        var heap: [Ranked] = []
        var queued = 0
        var running = 0
    }

    private var slots: [Int64: Slot] = [:]
    private var lanes: [Lane] = []
    private var laneOf: [Key: Int32] = [:]
    /// Each session's `max_connections_per_host` (6 when never told).
    private var sessionLimits: [String: Int] = [:]
    public static let defaultLimit = 6

    public init() {}

    /// Tasks waiting in the queue.
    public var queuedCount: Int { slots.count }

    public func isQueued(_ sequence: Int64) -> Bool { slots[sequence] != nil }

    /// Transfers running for `key`.
    public func running(_ key: Key) -> Int { laneOf[key].map { lanes[Int($0)].running } ?? 0 }

    /// A task entered the queue, or changed while in it (priority, host, own limit).
    public mutating func enqueue(_ entry: Entry) {
        let lane = laneIndex(entry.key)
        if let old = slots[entry.sequence] {
            lanes[Int(old.key)].queued -= 1
        }
        slots[entry.sequence] = Slot(key: lane, priority: entry.priority, limit: Int32(clamping: entry.limit ?? -1))
        lanes[Int(lane)].queued += 1
        push(Ranked(priority: entry.priority, sequence: entry.sequence), into: Int(lane))
    }

    /// A task left the queue (started, held, cancelled, deleted). Unknown ones are ignored.
    public mutating func dequeue(_ sequence: Int64) {
        guard let slot = slots.removeValue(forKey: sequence) else { return }
        lanes[Int(slot.key)].queued -= 1
        compactIfStale(Int(slot.key))
    }

    public mutating func setLimit(session: String, _ limit: Int) { sessionLimits[session] = limit }

    public mutating func forgetSession(_ session: String) { sessionLimits[session] = nil }

    /// A transfer of `key` began, or ended.
    public mutating func started(_ key: Key) { lanes[Int(laneIndex(key))].running += 1 }

    public mutating func ended(_ key: Key) {
        guard let lane = laneOf[key] else { return }
        lanes[Int(lane)].running = max(0, lanes[Int(lane)].running - 1)
    }

    /// The task to start next, taken out of the queue: the best head among the keys below their
    /// limit. Nil when nothing queued can start. The caller starts it (and calls `started`) or
    /// gives it back with `enqueue`.
    public mutating func next() -> Entry? {
        var best: (lane: Int, head: Ranked)?
        for index in lanes.indices where lanes[index].queued > 0 {
            guard let head = validHead(index) else { continue }
            let limit = limit(of: head.sequence, lane: index)
            guard lanes[index].running < limit else { continue }
            if best == nil || head.precedes(best!.head) { best = (index, head) }
        }
        guard let (lane, head) = best, let slot = slots.removeValue(forKey: head.sequence) else { return nil }
        lanes[lane].queued -= 1
        pop(lane)
        return Entry(
            sequence: head.sequence, priority: slot.priority, key: lanes[lane].key, limit: slot.limit < 0 ? nil : Int(slot.limit))
    }

    /// Keys that have queued tasks and no room: their tasks show `host_connection_limit`.
    public mutating func saturatedKeys() -> Set<Key> {
        var result: Set<Key> = []
        for index in lanes.indices where lanes[index].queued > 0 {
            guard let head = validHead(index) else { continue }
            if lanes[index].running >= limit(of: head.sequence, lane: index) { result.insert(lanes[index].key) }
        }
        return result
    }

    // MARK: Inside

    private mutating func laneIndex(_ key: Key) -> Int32 {
        if let index = laneOf[key] { return index }
        lanes.append(Lane(key: key))
        let index = Int32(lanes.count - 1)
        laneOf[key] = index
        return index
    }

    private func limit(of sequence: Int64, lane: Int) -> Int {
        if let own = slots[sequence]?.limit, own >= 0 { return Int(own) }
        return sessionLimits[lanes[lane].key.session] ?? Self.defaultLimit
    }

    private func isCurrent(_ ranked: Ranked, lane: Int) -> Bool {
        guard let slot = slots[ranked.sequence] else { return false }
        return Int(slot.key) == lane && slot.priority == ranked.priority
    }

    /// The lane's best queued task, dropping stale heap elements on the way.
    private mutating func validHead(_ lane: Int) -> Ranked? {
        while let head = lanes[lane].heap.first {
            if isCurrent(head, lane: lane) { return head }
            pop(lane)
        }
        return nil
    }

    /// Rebuilds a lane's heap when stale elements outnumber live ones (many priority changes or
    /// removals), so memory follows the queue.
    private mutating func compactIfStale(_ lane: Int) {
        guard lanes[lane].heap.count > 64, lanes[lane].heap.count > 2 * lanes[lane].queued else { return }
        let live = lanes[lane].heap.filter { isCurrent($0, lane: lane) }
        lanes[lane].heap = []
        lanes[lane].heap.reserveCapacity(live.count)
        for element in live { push(element, into: lane) }
    }

    private mutating func push(_ element: Ranked, into lane: Int) {
        lanes[lane].heap.append(element)
        var child = lanes[lane].heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard lanes[lane].heap[child].precedes(lanes[lane].heap[parent]) else { break }
            lanes[lane].heap.swapAt(child, parent)
            child = parent
        }
    }

    private mutating func pop(_ lane: Int) {
        let last = lanes[lane].heap.count - 1
        guard last >= 0 else { return }
        lanes[lane].heap.swapAt(0, last)
        lanes[lane].heap.removeLast()
        var parent = 0
        let count = lanes[lane].heap.count
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var first = parent
            if left < count, lanes[lane].heap[left].precedes(lanes[lane].heap[first]) { first = left }
            if right < count, lanes[lane].heap[right].precedes(lanes[lane].heap[first]) { first = right }
            guard first != parent else { return }
            lanes[lane].heap.swapAt(parent, first)
            parent = first
        }
    }
}
