extension StringProtocol {
    /// The text without its leading and trailing characters that `isTrimmed` picks (whitespace
    /// unless told otherwise): Foundation's trimmingCharacters without Foundation.
    public func trimmed(where isTrimmed: (Character) -> Bool = { $0.isWhitespace }) -> String {
        guard let first = firstIndex(where: { !isTrimmed($0) }), let last = lastIndex(where: { !isTrimmed($0) }) else {
            return ""
        }
        return String(self[first...last])
    }
}

extension String {
    /// Lower-cased, ASCII letters byte by byte (header names, hosts); text with other characters
    /// through Unicode's rules. `lowercased()` goes through Unicode for every character.
    public var asciiLowercased: String {
        var text = self
        return text.withUTF8 { bytes in
            guard bytes.allSatisfy({ $0 < 0x80 }) else { return lowercased() }
            guard bytes.contains(where: { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") }) else { return self }
            return String(unsafeUninitializedCapacity: bytes.count) { output in
                for (index, byte) in bytes.enumerated() {
                    output[index] = byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") ? byte | 0x20 : byte
                }
                return bytes.count
            }
        }
    }
}
