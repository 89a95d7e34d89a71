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
            guard bytes.contains(where: { $0.asciiLowercased != $0 }) else { return self }
            return String(unsafeUninitializedCapacity: bytes.count) { output in
                for (index, byte) in bytes.enumerated() { output[index] = byte.asciiLowercased }
                return bytes.count
            }
        }
    }
}

extension UInt8 {
    /// The byte with an ASCII capital letter made small; any other byte as it is.
    public var asciiLowercased: UInt8 { self >= UInt8(ascii: "A") && self <= UInt8(ascii: "Z") ? self | 0x20 : self }
}
