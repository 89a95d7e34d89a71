import CGlibc
import Synchronization

/// Identifiers (time-ordered, with random bits from the kernel's generator) and random numbers.
public enum RandomID {
    /// `prefix` + 24 lower-case base-32 characters: 9 of the time in milliseconds, most significant
    /// first, then 15 random ones (75 bits). Ids made later sort after those made before, so the
    /// unique indexes over task and event ids grow at their end, a few pages per batch, rather than
    /// in random pages all over the file (which made each enqueue slower as the queue grew).
    /// Written as bytes: it runs twice per task (its id, its final event's id).
    public static func make(prefix: String, at time: Timestamp) -> String {
        let (random, more) = pool.withLock { ($0.next(), $0.next()) }
        let milliseconds = UInt64(max(0, time * 1000))
        let prefixBytes = prefix.utf8
        return String(unsafeUninitializedCapacity: prefixBytes.count + 24) { output in
            var index = 0
            for byte in prefixBytes {
                output[index] = byte
                index += 1
            }
            // 45 bits of milliseconds (until the year 3084), 5 bits a character.
            for shift in stride(from: 40, through: 0, by: -5) {
                output[index] = alphabet[Int((milliseconds >> UInt64(shift)) & 31)]
                index += 1
            }
            var word = random
            for _ in 0..<12 {
                output[index] = alphabet[Int(word & 31)]
                word >>= 5
                index += 1
            }
            // Three more from a second draw.
            var more = more
            for _ in 0..<3 {
                output[index] = alphabet[Int(more & 31)]
                more >>= 5
                index += 1
            }
            return index
        }
    }

    /// The kernel's random words, drawn 256 at a time: an id takes two, and a getrandom(2) call
    /// for each (what `SystemRandomNumberGenerator` makes) cost the writer two system calls for
    /// every event it wrote and the API two for every task.
    private static let pool = Mutex(RandomWords())

    private struct RandomWords: ~Copyable {
        private var words = [UInt64](repeating: 0, count: 256)
        private var used = 256

        mutating func next() -> UInt64 {
            if used == words.count {
                let filled = words.withUnsafeMutableBytes { bh_getrandom($0.baseAddress, $0.count) }
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
