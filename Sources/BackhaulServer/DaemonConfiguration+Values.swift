import BackhaulCore
import JSONCodec

/// How a setting's values are read from each source, checked, and shown.
struct SettingValue<Value: Sendable>: Sendable {
    /// A flag's or a variable's text.
    let text: @Sendable (String) throws(SettingError) -> Value
    /// A config-file member; by default a string, number or boolean read as its text.
    let json: @Sendable (JSON) throws(SettingError) -> Value
    /// A repeatable flag's values, in order; by default each is read and the last one wins.
    let texts: (@Sendable ([String]) throws(SettingError) -> Value)?
    /// The value as `/v1/info` shows it, and the usage text and README describe a default.
    let show: @Sendable (Value) -> JSON

    init(
        text: @escaping @Sendable (String) throws(SettingError) -> Value,
        json: (@Sendable (JSON) throws(SettingError) -> Value)? = nil,
        texts: (@Sendable ([String]) throws(SettingError) -> Value)? = nil, show: @escaping @Sendable (Value) -> JSON
    ) {
        self.text = text
        if let json {
            self.json = json
        } else {
            // (Not `json ?? { … }`: swiftc 6.3.1 crashes lowering a typed-throws closure in `??`.)
            self.json = { (member) throws(SettingError) in try text(Self.scalarText(member)) }
        }
        self.texts = texts
        self.show = show
    }

    /// A string, number or boolean of the config file as a flag would spell it.
    static func scalarText(_ member: JSON) throws(SettingError) -> String {
        switch member {
        case .string(let text): return text
        case .int(let number): return String(number)
        case .double(let number): return String(number)
        case .bool(let flag): return String(flag)
        default: throw SettingError("is \(member.typeName), not a string, number or boolean")
        }
    }
}

// MARK: The kinds of value

extension SettingValue where Value == String {
    /// A file or directory path (not checked here: the daemon reports what it cannot open).
    static var path: Self {
        Self(
            text: { (text) throws(SettingError) in
                guard !text.isEmpty else { throw SettingError("must not be empty") }
                return text
            }, show: { .string($0) })
    }

    /// One of a fixed set of words.
    static func oneOf(_ words: [String]) -> Self {
        Self(
            text: { (text) throws(SettingError) in
                guard words.contains(text) else {
                    throw SettingError("must be one of \(words.joined(separator: ", ")), not \(text)")
                }
                return text
            }, show: { .string($0) })
    }
}

extension SettingValue where Value == String? {
    static var optionalPath: Self {
        Self(
            text: { (text) throws(SettingError) in
                guard !text.isEmpty else { throw SettingError("must not be empty") }
                return text
            }, show: { $0.map { .string($0) } ?? .null })
    }
}

extension SettingValue where Value == Int {
    /// A whole number in `range`.
    static func integer(_ range: ClosedRange<Int>) -> Self {
        Self(
            text: { (text) throws(SettingError) in
                guard let number = Int(text), range.contains(number) else {
                    throw SettingError(
                        range.upperBound == .max
                            ? "must be a whole number, at least \(range.lowerBound)"
                            : "must be a whole number from \(range.lowerBound) to \(range.upperBound)")
                }
                return number
            }, show: { .int(Int64($0)) })
    }
}

extension SettingValue where Value == Double {
    /// A finite number of seconds, at least `minimum` (above it, when `exclusive`) and at most `maximum`.
    static func seconds(_ minimum: Double, exclusive: Bool = false, maximum: Double? = nil) -> Self {
        Self(
            text: { (text) throws(SettingError) in
                guard let number = Double(text), number.isFinite, exclusive ? number > minimum : number >= minimum,
                    number <= maximum ?? .greatestFiniteMagnitude
                else {
                    let lower = exclusive ? "a positive number of seconds" : "a number of seconds, at least \(minimum.shortText)"
                    throw SettingError("must be \(lower)" + (maximum.map { " and at most \($0.shortText)" } ?? ""))
                }
                return number
            }, show: { .double($0) })
    }

}

extension SettingValue where Value == [Double] {
    /// Delays in seconds, comma-separated (in the file, an array of numbers too).
    static func delays(count: ClosedRange<Int>, maximum: Double) -> Self {
        let problem =
            "must be \(count.lowerBound) to \(count.upperBound) comma-separated delays of 0 to \(maximum.shortText) seconds"
        let read: @Sendable (String) throws(SettingError) -> [Double] = { (text) throws(SettingError) in
            let delays = text.split(separator: ",").map { Double($0.trimmed()) }
            guard count.contains(delays.count), delays.allSatisfy({ ($0 ?? -1) >= 0 && ($0 ?? 0) <= maximum }) else {
                throw SettingError(problem)
            }
            return delays.map { $0! }
        }
        return Self(
            text: read,
            json: { (member) throws(SettingError) in
                guard case .array(let items) = member else { return try read(Self.scalarText(member)) }
                let numbers = items.compactMap(\.doubleValue)
                guard numbers.count == items.count else { throw SettingError(problem) }
                return try read(numbers.map { String($0) }.joined(separator: ","))
            }, show: { .array($0.map { .double($0) }) })
    }
}

extension SettingValue where Value == [String] {
    /// A list of strings: each flag one item, the variable's text split at `separator`, an
    /// array of strings in the file; each item checked by `check`. `nonEmpty` names what the
    /// list holds when it may not be empty.
    static func list(
        separator: Character? = nil, nonEmpty: String? = nil,
        _ check: @escaping @Sendable (String) throws(SettingError) -> Void = { _ in }
    ) -> Self {
        let all: @Sendable ([String]) throws(SettingError) -> [String] = { (items) throws(SettingError) in
            if let nonEmpty, items.isEmpty { throw SettingError("at least one \(nonEmpty) is needed") }
            for item in items { try check(item) }
            return items
        }
        return Self(
            text: { (text) throws(SettingError) in
                try all(separator.map { text.split(separator: $0).map(String.init) } ?? [text])
            },
            json: { (member) throws(SettingError) in
                guard case .array(let items) = member, items.allSatisfy({ $0.stringValue != nil }) else {
                    throw SettingError("must be an array of strings")
                }
                return try all(items.compactMap(\.stringValue))
            }, texts: all, show: { .array($0.map { .string($0) }) })
    }
}

extension SettingValue where Value == Bool {
    /// On or off: a switch flag turns it on; text is `true`, `1`, `false` or `0`.
    static var onOff: Self {
        Self(
            text: { (text) throws(SettingError) in
                switch text {
                case "true", "1": return true
                case "false", "0": return false
                default: throw SettingError("must be true, 1, false or 0, not \(text)")
                }
            }, show: { .bool($0) })
    }
}

extension Double {
    /// `10`, not `10.0`; `0.1` as it is.
    var shortText: String { rounded() == self && abs(self) < 1e15 ? String(Int64(self)) : String(self) }
}

extension SettingValue where Value: RawRepresentable & CaseIterable, Value.RawValue == String {
    /// One of an enumeration's cases, spelled as its raw value.
    static var oneOfCases: Self {
        Self(
            text: { (text) throws(SettingError) in
                guard let value = Value(rawValue: text) else {
                    throw SettingError("must be one of \(Value.allCases.map(\.rawValue).joined(separator: ", ")), not \(text)")
                }
                return value
            }, show: { .string($0.rawValue) })
    }
}
