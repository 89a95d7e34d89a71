import JSONValue

/// A client input that does not fit the API: which field, and what is wrong with it.
public struct ValidationError: Error, Sendable, Equatable, CustomStringConvertible {
    public var field: String
    public var message: String
    public init(_ field: String, _ message: String) {
        self.field = field
        self.message = message
    }
    public var description: String { field.isEmpty ? message : "\(field): \(message)" }
}

/// Reads the members of one JSON object with typed accessors that name the field on error.
public struct FieldReader {
    public let object: JSONObject
    public let path: String

    public init(_ value: JSON, path: String = "") throws(ValidationError) {
        guard let object = value.objectValue else {
            throw ValidationError(path, "must be an object, not \(value.typeName)")
        }
        self.object = object
        self.path = path
    }

    public func field(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    /// Refuses members this object does not define (typos must not pass silently). A short list
    /// written at the call is compared in turn (no set hashed together for every object read: this
    /// runs for every task enqueued); a set is looked up.
    public func rejectUnknown(_ allowed: some Sequence<String>) throws(ValidationError) {
        for key in object.keys where !allowed.contains(key) {
            throw ValidationError(field(key), "is not a known field")
        }
    }

    public func has(_ key: String) -> Bool { object[key] != nil }

    /// The member, treating an explicit null like an absent one.
    public func value(_ key: String) -> JSON? {
        guard let value = object[key], !value.isNull else { return nil }
        return value
    }

    public func string(_ key: String, maxLength: Int = 8192) throws(ValidationError) -> String? {
        guard let value = value(key) else { return nil }
        guard let text = value.stringValue else { throw ValidationError(field(key), "must be a string") }
        guard text.utf8.count <= maxLength else {
            throw ValidationError(field(key), "is longer than \(maxLength) bytes")
        }
        guard !text.utf8.contains(0) else { throw ValidationError(field(key), "must not contain NUL characters") }
        return text
    }

    /// A `network_service_type` value (`default` or `background`); nil when absent or null.
    public func serviceType(_ key: String) throws(ValidationError) -> NetworkServiceType? {
        guard let text = try string(key, maxLength: 64) else { return nil }
        guard let type = NetworkServiceType(rawValue: text) else {
            throw ValidationError(field(key), "must be one of default, background")
        }
        return type
    }

    public func requiredString(_ key: String, maxLength: Int = 8192) throws(ValidationError) -> String {
        guard let text = try string(key, maxLength: maxLength) else {
            throw ValidationError(field(key), "is required")
        }
        return text
    }

    public func bool(_ key: String) throws(ValidationError) -> Bool? {
        guard let value = value(key) else { return nil }
        guard let flag = value.boolValue else { throw ValidationError(field(key), "must be true or false") }
        return flag
    }

    public func number(_ key: String, in range: ClosedRange<Double>) throws(ValidationError) -> Double? {
        guard let value = value(key) else { return nil }
        guard let number = value.doubleValue, number.isFinite else {
            throw ValidationError(field(key), "must be a number")
        }
        guard range.contains(number) else {
            throw ValidationError(field(key), "must be between \(format(range.lowerBound)) and \(format(range.upperBound))")
        }
        return number
    }

    public func integer(_ key: String, in range: ClosedRange<Int64>) throws(ValidationError) -> Int64? {
        guard let value = value(key) else { return nil }
        guard let number = value.intValue else { throw ValidationError(field(key), "must be an integer") }
        guard range.contains(number) else {
            throw ValidationError(field(key), "must be between \(range.lowerBound) and \(range.upperBound)")
        }
        return number
    }

    public func timestamp(_ key: String) throws(ValidationError) -> Timestamp? {
        guard let text = try string(key, maxLength: 64) else { return nil }
        guard let time = RFC3339.parse(text) else {
            throw ValidationError(field(key), "must be an RFC 3339 date-time such as 2026-11-22T02:00:00Z")
        }
        return time
    }

    public func object(_ key: String) throws(ValidationError) -> FieldReader? {
        guard let value = value(key) else { return nil }
        return try FieldReader(value, path: field(key))
    }

    /// A map of strings to strings (headers, form fields), kept in order.
    public func stringMap(_ key: String, maxEntries: Int = 100, maxValueLength: Int = 8192) throws(ValidationError)
        -> [(String, String)]?
    {
        guard let reader = try object(key) else { return nil }
        guard reader.object.count <= maxEntries else {
            throw ValidationError(field(key), "has more than \(maxEntries) entries")
        }
        var result: [(String, String)] = []
        for (name, _) in reader.object {
            result.append((name, try reader.requiredString(name, maxLength: maxValueLength)))
        }
        return result
    }

    /// A list of strings (patterns), at most `maxEntries`.
    public func stringList(_ key: String, maxEntries: Int = 100, maxLength: Int = 256) throws(ValidationError) -> [String]? {
        guard let value = value(key) else { return nil }
        guard let items = value.arrayValue, items.count <= maxEntries else {
            throw ValidationError(field(key), "must be an array of at most \(maxEntries) strings")
        }
        var result: [String] = []
        for item in items {
            guard let text = item.stringValue, text.utf8.count <= maxLength else {
                throw ValidationError(field(key), "must hold strings of at most \(maxLength) bytes")
            }
            result.append(text)
        }
        return result
    }

    private func format(_ value: Double) -> String {
        value.rounded() == value && abs(value) < 1e15 ? String(Int64(value)) : String(value)
    }
}
