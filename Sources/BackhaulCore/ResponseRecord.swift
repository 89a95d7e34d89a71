import JSONValue

/// The final response of a task: status, headers, and at most 64 KiB of body. Its JSON is
/// written once, when it is made: a task's end stores it and puts it in the task's event too.
public struct ResponseRecord: Sendable, Equatable {
    public static let maxBodyBytes = 64 * 1024

    public let status: Int
    public let headers: [(String, String)]
    public let body: [UInt8]
    /// `{"status", "headers", "body", "body_encoding"}`, secret headers and cookies redacted, as
    /// stored and shown. A header named twice shows its last value where it first appeared.
    public let jsonText: String

    public init(status: Int, headers: [(String, String)], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body.count > Self.maxBodyBytes ? Array(body.prefix(Self.maxBodyBytes)) : body
        jsonText = Self.render(status: status, headers: headers, body: self.body)
    }

    public static func == (lhs: ResponseRecord, rhs: ResponseRecord) -> Bool {
        lhs.status == rhs.status && lhs.body == rhs.body && lhs.headers.elementsEqual(rhs.headers, by: ==)
    }

    public func writeJSON(to writer: inout JSONWriter) { writer.raw(jsonText) }

    private static func render(status: Int, headers: [(String, String)], body: [UInt8]) -> String {
        var writer = JSONWriter(capacity: 256 + body.count)
        writer.object { object in
            object.key("status")
            object.int(Int64(status))
            object.key("headers")
            object.object { shown in
                for index in headers.indices {
                    let name = headers[index].0
                    guard !headers[..<index].contains(where: { $0.0 == name }) else { continue }
                    let value = headers.last(where: { $0.0 == name })!.1
                    shown.key(named: name)
                    shown.string(HeaderRules.isHiddenInResponse(name) ? HeaderRules.redactedValue : value)
                }
            }
            // No body (most answers to an upload) is text; `String(validating:)` costs ~900
            // instructions even on no bytes.
            let text = body.isEmpty ? "" : String(validating: body, as: UTF8.self)
            object.key("body")
            object.string(text ?? Base64.encode(body))
            object.key("body_encoding")
            object.string(text == nil ? "base64" : "utf8")
        }
        return writer.text
    }

    public static func decode(_ value: JSON) -> ResponseRecord? {
        guard let status = value["status"]?.intValue else { return nil }
        var headers: [(String, String)] = []
        for (name, value) in value["headers"]?.objectValue ?? [:] { headers.append((name, value.stringValue ?? "")) }
        let text = value["body"]?.stringValue ?? ""
        let body = value["body_encoding"]?.stringValue == "base64" ? (Base64.decode(text) ?? []) : Array(text.utf8)
        return ResponseRecord(status: Int(status), headers: headers, body: body)
    }
}
