/// Random identifiers from the kernel's generator.
public enum RandomID {
    /// `prefix` + 24 lower-case base-32 characters (120 random bits), written as bytes: it runs
    /// twice per task (its id, its final event's id).
    public static func make(prefix: String) -> String {
        var generator = SystemRandomNumberGenerator()
        // 120 bits: 60 from each of two words, 12 characters of 5 bits each.
        let words: (UInt64, UInt64) = (generator.next(), generator.next())
        let prefixBytes = prefix.utf8
        return String(unsafeUninitializedCapacity: prefixBytes.count + 24) { output in
            var index = 0
            for byte in prefixBytes {
                output[index] = byte
                index += 1
            }
            func append(_ word: UInt64) {
                var word = word
                for _ in 0..<12 {
                    output[index] = alphabet[Int(word & 31)]
                    word >>= 5
                    index += 1
                }
            }
            append(words.0)
            append(words.1)
            return index
        }
    }

    private static let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567".utf8)

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
