/// Random identifiers from the kernel's generator.
public enum RandomID {
    /// `prefix` + 24 lower-case base-32 characters (120 random bits).
    public static func make(prefix: String) -> String {
        var bytes = [UInt8](repeating: 0, count: 15)
        fill(&bytes)
        let alphabet = Self.alphabet
        var result = prefix
        var buffer: UInt32 = 0
        var bits = 0
        for byte in bytes {
            buffer = buffer << 8 | UInt32(byte)
            bits += 8
            while bits >= 5 {
                bits -= 5
                result.append(alphabet[Int(buffer >> UInt32(bits) & 31)])
            }
        }
        return result
    }

    private static let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567")

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
