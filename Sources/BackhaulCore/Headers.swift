import JSONValue

/// Numbers in the headers servers answer.
public enum HeaderNumber {
    /// A count as tus's `Upload-Offset` and a Structured Field integer write it: 1 to 15 ASCII
    /// digits, no sign, no space; nil otherwise (`-5`, `+5` and `-0` are not offsets).
    public static func count(_ text: some StringProtocol) -> Int64? {
        guard (1...15).contains(text.utf8.count), text.utf8.allSatisfy({ (48...57).contains($0) }) else { return nil }
        return Int64(text)
    }
}

/// Rules for request headers given by clients: valid tokens, no framing headers, redaction.
public enum HeaderRules {
    /// The same name-value pairs, in whatever order.
    public static func sameSet(_ lhs: [(String, String)], _ rhs: [(String, String)]) -> Bool {
        guard lhs.count == rhs.count else { return false }
        if lhs.elementsEqual(rhs, by: ==) { return true }
        let order: ((String, String), (String, String)) -> Bool = { $0.0 != $1.0 ? $0.0 < $1.0 : $0.1 < $1.1 }
        return lhs.sorted(by: order).elementsEqual(rhs.sorted(by: order), by: ==)
    }

    /// Headers the transfer layer owns; a client may not set them.
    static let reserved: Set<String> = ["content-length", "transfer-encoding", "host", "connection", "expect", "upgrade", "te"]

    public static func validate(name: String, value: String, field: String) throws(ValidationError) {
        let tokenCharacters = Set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
        guard !name.isEmpty, name.count <= 256, name.allSatisfy({ tokenCharacters.contains($0) }) else {
            throw ValidationError("\(field).\(name)", "is not a valid header name")
        }
        guard !reserved.contains(name.lowercased()) else {
            throw ValidationError("\(field).\(name)", "is set by Backhaul and cannot be given")
        }
        guard !value.unicodeScalars.contains(where: { $0 == "\r" || $0 == "\n" || $0 == "\0" }) else {
            throw ValidationError("\(field).\(name)", "must not contain CR, LF or NUL")
        }
    }

    /// True for headers whose values never leave the service (OpenAPI/backhaul.yaml).
    public static func isSecret(_ name: String) -> Bool {
        var name = name
        return name.withUTF8 { isSecret(bytes: $0) }
    }

    /// True for response headers whose values are hidden where a response is stored and shown:
    /// the secrets, and the cookies a server sets.
    public static func isHiddenInResponse(_ name: String) -> Bool {
        var name = name
        return name.withUTF8 { isSecret(bytes: $0) || ($0.count == setCookie.count && matches($0, at: 0, setCookie)) }
    }

    // On the name's bytes, without a lower-cased copy: this runs for every header of every
    // stored response and every task shown.
    private static func isSecret(bytes name: UnsafeBufferPointer<UInt8>) -> Bool {
        for secret in secretNames where name.count == secret.count && matches(name, at: 0, secret) { return true }
        for word in secretWords where word.count <= name.count {
            let first = word[0]
            for offset in 0...(name.count - word.count)
            where name[offset].asciiLowercased == first && matches(name, at: offset, word) {
                return true
            }
        }
        return false
    }

    /// Whether `bytes` from `offset` spell `lower` (lower-case ASCII), ignoring the case of letters.
    /// A plain loop: it runs for every offset of every header name of every stored response.
    private static func matches(_ bytes: UnsafeBufferPointer<UInt8>, at offset: Int, _ lower: [UInt8]) -> Bool {
        var index = 0
        while index < lower.count {
            guard bytes[offset + index].asciiLowercased == lower[index] else { return false }
            index += 1
        }
        return true
    }

    private static let secretNames = ["authorization", "proxy-authorization", "cookie"].map { Array($0.utf8) }
    private static let secretWords = ["token", "secret", "key", "signature", "password"].map { Array($0.utf8) }
    private static let setCookie = Array("set-cookie".utf8)

    public static let redactedValue = "[redacted]"

    public static func json(_ headers: [(String, String)], redacted: Bool) -> JSON {
        var object = JSONObject()
        for (name, value) in headers {
            object[name] = .string(redacted && isSecret(name) ? redactedValue : value)
        }
        return .object(object)
    }

    /// `base` with `overrides` applied by case-insensitive name.
    public static func merged(_ base: [(String, String)], _ overrides: [(String, String)]) -> [(String, String)] {
        var result = base
        for (name, value) in overrides {
            result.removeAll { $0.0.lowercased() == name.lowercased() }
            result.append((name, value))
        }
        return result
    }
}
