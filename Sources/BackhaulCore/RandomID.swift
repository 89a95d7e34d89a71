import Synchronization
import Threads

/// Identifiers (time-ordered, with random bits from the kernel's generator) and random numbers.
public enum RandomID {
    /// `prefix` + 24 lower-case base-32 characters: 9 of the time in milliseconds, then 15 random
    /// ones (75 bits). Ids made later sort after those made before, so the unique indexes over task
    /// and event ids grow at their end, a few pages per batch, rather than in random pages all over
    /// the file (which made each enqueue slower as the queue grew).
    /// Written as bytes: it runs twice per task (its id, its final event's id).
    public static func make(prefix: String, at time: Timestamp) -> String {
        let (count, tail) = firstDraw()
        return format(prefix: prefix, milliseconds: milliseconds(time), count: count, tail: tail)
    }

    /// Ids made at one time that sort in the order they are made: a batch's tasks, which all carry
    /// its request's time. The first is as `make` makes it; in each next one the 12 characters
    /// after the time are one more (a 60-bit count), the last 3 drawn again. With random ids, the
    /// tasks of a batch went into the indexes over task ids (the unique one, events by task) in
    /// random order: each task's final event a page of `events_by_task` of its own, 0.9 to 1.0 WAL
    /// frames a task over 2,000 small uploads; in order, 0.3 to 0.6.
    public struct Series {
        private let prefix: String
        private let milliseconds: UInt64
        /// The last id's count (nil: none made yet).
        private var count: UInt64?

        public init(prefix: String, at time: Timestamp) {
            self.prefix = prefix
            milliseconds = RandomID.milliseconds(time)
        }

        public mutating func next() -> String {
            let current: UInt64
            let tail: UInt64
            if let count {
                current = (count &+ 1) & ((1 << 60) - 1)
                tail = pool.withLock { $0.next() }
            } else {
                (current, tail) = RandomID.firstDraw()
            }
            count = current
            return RandomID.format(prefix: prefix, milliseconds: milliseconds, count: current, tail: tail)
        }
    }

    private static func milliseconds(_ time: Timestamp) -> UInt64 { UInt64(max(0, time * 1000)) }

    /// A random 60-bit count and a random tail, under one lock.
    private static func firstDraw() -> (count: UInt64, tail: UInt64) { pool.withLock { ($0.next() >> 4, $0.next()) } }

    /// The id's text: the prefix, then 45 bits of milliseconds (until the year 3084) and the 60-bit
    /// count, 5 bits a character, most significant first, then 3 characters of `tail`.
    private static func format(prefix: String, milliseconds: UInt64, count: UInt64, tail: UInt64) -> String {
        let prefixBytes = prefix.utf8
        return String(unsafeUninitializedCapacity: prefixBytes.count + 24) { output in
            var index = 0
            for byte in prefixBytes {
                output[index] = byte
                index += 1
            }
            for shift in stride(from: 40, through: 0, by: -5) {
                output[index] = alphabet[Int((milliseconds >> UInt64(shift)) & 31)]
                index += 1
            }
            for shift in stride(from: 55, through: 0, by: -5) {
                output[index] = alphabet[Int((count >> UInt64(shift)) & 31)]
                index += 1
            }
            var tail = tail
            for _ in 0..<3 {
                output[index] = alphabet[Int(tail & 31)]
                tail >>= 5
                index += 1
            }
            return index
        }
    }

    /// The kernel's random words, drawn 256 at a time: an id takes two (one in a series after its
    /// first), taken under one lock, and a getrandom(2) call for each (what
    /// `SystemRandomNumberGenerator` makes) cost the writer two system calls for every event it
    /// wrote and the API two for every task.
    private static let pool = Mutex(RandomWords())

    private struct RandomWords: ~Copyable {
        private var words = [UInt64](repeating: 0, count: 256)
        private var used = 256

        mutating func next() -> UInt64 {
            if used == words.count {
                let filled = words.withUnsafeMutableBytes { KernelRandom.fill($0) }
                if filled != words.count * 8 {
                    // A read of more than 256 bytes can come back short when a signal interrupts
                    // it: word by word then.
                    var generator = SystemRandomNumberGenerator()
                    for index in words.indices { words[index] = generator.next() }
                }
                used = 0
            }
            defer { used += 1 }
            return words[used]
        }
    }

    /// Base-32 digits in ASCII order, so that text order is numeric order.
    private static let alphabet = Array("234567abcdefghijklmnopqrstuvwxyz".utf8)

    /// Fills `bytes` from the kernel's getrandom(2) (SystemRandomNumberGenerator), eight bytes per
    /// call: one call per byte was a tenth of the enqueue path's time.
    public static func fill(_ bytes: inout [UInt8]) {
        var generator = SystemRandomNumberGenerator()
        var index = 0
        while index < bytes.count {
            var word: UInt64 = generator.next()
            for _ in 0..<min(8, bytes.count - index) {
                bytes[index] = UInt8(truncatingIfNeeded: word)
                word >>= 8
                index += 1
            }
        }
    }

    /// A uniform random Double in 0..<1.
    public static func unit() -> Double {
        var bytes = [UInt8](repeating: 0, count: 8)
        fill(&bytes)
        let value = bytes.reduce(UInt64(0)) { $0 << 8 | UInt64($1) } >> 11
        return Double(value) / Double(1 << 53)
    }
}
