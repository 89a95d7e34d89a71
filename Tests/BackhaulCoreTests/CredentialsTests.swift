import BackhaulCore
import JSON
import Testing

@Suite("Where a task's requests may go")
struct LocationRuleTests {
    static let task = "https://up.example.com/files/"
    /// (allow-list, URL a server named, refused?)
    static let rows: [([String], String, Bool)] = [
        ([], "http://elsewhere.example/x", false),
        (["up.example.com"], "https://up.example.com/files/abc", false),
        // A host pattern admits the host on any port and scheme; a scheme pattern only its scheme.
        (["up.example.com"], "https://up.example.com:8443/files/abc", false),
        (["https://up.example.com"], "http://up.example.com/files/abc", true),
        (["up.example.com"], "https://other.example.com/files/abc", true),
        (["*.example.com"], "https://store.example.com/files/abc", false),
        (["https://*.example.com"], "http://store.example.com/files/abc", true),
        (["up.example.com", "127.0.0.1"], "http://127.0.0.1:9/files/abc", false),
        (["up.example.com"], "http://127.0.0.2:9/files/abc", true),
        (["up.example.com"], "/files/abc", true),
        (["up.example.com"], "ftp://up.example.com/files/abc", true),
    ]

    @Test("a server-given URL on another origin needs the allow-list", arguments: rows.indices)
    func location(_ index: Int) {
        let (hosts, url, refused) = Self.rows[index]
        var rules = DestinationRules()
        rules.uploadHosts = hosts
        let refusal = rules.locationRefusal(url, taskURL: Self.task)
        #expect((refusal != nil) == refused, "\(hosts) \(url)")
        if let refusal {
            #expect(refusal.code == -1011)
            #expect(refusal.reason == .locationHostNotAllowed)
        }
    }

    @Test("the error's reason is kept through its stored form, and absent when there is none")
    func reasonRoundTrip() throws {
        let error = TaskError(.badServerResponse, message: "m", reason: .locationHostNotAllowed)
        let stored = TaskRecord.errorJSON(error)
        #expect(stored["reason"]?.stringValue == "location_host_not_allowed")
        #expect(TaskRecord.decodeError(try JSON.parse(stored.serialized())) == error)
        #expect(TaskRecord.errorJSON(TaskError(.timedOut, message: "m"))["reason"] == nil)
    }
}
