import JSONCodec

/// Reads one object of an API answer for the typed results. A required member that is missing,
/// or any member of the wrong type, is an `APIError.unexpectedAnswer` naming where it was
/// (`tasks[2].progress.fraction`); null counts as absent.
struct AnswerReader {
    private let object: JSONObject
    private let path: String

    init(_ value: JSON, at path: String = "") throws(APIError) {
        guard let object = value.objectValue else {
            throw .unexpectedAnswer("\(path.isEmpty ? "the answer" : path) is \(value.typeName), not an object")
        }
        self.object = object
        self.path = path
    }

    func location(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    private func member<T>(_ key: String, _ kind: String, _ read: (JSON) -> T?) throws(APIError) -> T? {
        guard let value = object[key], !value.isNull else { return nil }
        guard let typed = read(value) else { throw .unexpectedAnswer("\(location(key)) is \(value.typeName), not \(kind)") }
        return typed
    }

    private func required<T>(_ key: String, _ value: T?) throws(APIError) -> T {
        guard let value else { throw .unexpectedAnswer("\(location(key)) is missing") }
        return value
    }

    func optionalString(_ key: String) throws(APIError) -> String? { try member(key, "a string", \.stringValue) }
    func string(_ key: String) throws(APIError) -> String { try required(key, optionalString(key)) }

    func optionalInt(_ key: String) throws(APIError) -> Int64? { try member(key, "an integer", \.intValue) }
    func int(_ key: String) throws(APIError) -> Int64 { try required(key, optionalInt(key)) }

    func optionalDouble(_ key: String) throws(APIError) -> Double? { try member(key, "a number", \.doubleValue) }
    func double(_ key: String) throws(APIError) -> Double { try required(key, optionalDouble(key)) }

    func bool(_ key: String) throws(APIError) -> Bool { try required(key, member(key, "a boolean", \.boolValue)) }

    /// A member that is one of an enumeration's raw values.
    func value<T: RawRepresentable<String>>(_ key: String, as type: T.Type) throws(APIError) -> T {
        let text = try string(key)
        guard let value = T(rawValue: text) else {
            throw .unexpectedAnswer("\(location(key)) is \(text), which this client does not know")
        }
        return value
    }

    func optionalObject(_ key: String) throws(APIError) -> AnswerReader? {
        guard let value = object[key], !value.isNull else { return nil }
        return try AnswerReader(value, at: location(key))
    }
    func object(_ key: String) throws(APIError) -> AnswerReader { try required(key, optionalObject(key)) }

    /// An array member, each element decoded by `decode` with its index in the location.
    func array<T>(_ key: String, _ decode: (JSON, String) throws(APIError) -> T) throws(APIError) -> [T] {
        let items = try required(key, member(key, "an array", \.arrayValue))
        var decoded: [T] = []
        for (index, item) in items.enumerated() { decoded.append(try decode(item, "\(location(key))[\(index)]")) }
        return decoded
    }

    /// An object member of numbers by name (`task_counts`).
    func counts(_ key: String) throws(APIError) -> [String: Int] {
        let counts = try object(key)
        var result: [String: Int] = [:]
        for name in counts.object.keys { result[name] = Int(try counts.int(name)) }
        return result
    }
}
