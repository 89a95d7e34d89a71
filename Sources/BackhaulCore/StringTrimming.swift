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
