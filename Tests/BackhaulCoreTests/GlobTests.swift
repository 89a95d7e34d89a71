import Testing

@testable import BackhaulCore

@Suite("Glob")
struct GlobTests {
    @Test(
        "matches like a shell pattern",
        arguments: [
            ("*", "", true), ("*", "anything", true), ("", "", true), ("", "a", false),
            ("cam-*", "cam-3", true), ("cam-*", "cam-", true), ("cam-*", "cab-3", false),
            ("w?an*", "wlan0", true), ("w?an*", "wlxan0", false), ("?", "", false), ("?", "é", true),
            ("*.example.com", "api.example.com", true), ("*.example.com", "example.com", false),
            ("a*b*c", "aXbYc", true), ("a*b*c", "aXbYcZ", false), ("a*b*c", "abcbc", true),
            ("*a", "bbba", true), ("*a*", "b", false), ("**", "x", true), ("a**b", "ab", true),
            ("a*a*a*b", "aaaaab", true), ("a*a*a*b", "aaaaa", false),
        ])
    func table(pattern: String, text: String, expected: Bool) {
        #expect(Glob.matches(pattern, text) == expected, "\(pattern) against \(text)")
    }

    /// A token scope `a*a*…*b` against a session id of 64 `a`s took the old recursive matcher
    /// longer than a minute (it tried every way to split the text among the stars).
    @Test("an adversarial pattern costs at most pattern × text steps", .timeLimit(.minutes(1)))
    func adversarial() {
        let pattern = Array((String(repeating: "a*", count: 12) + "b").unicodeScalars)
        let text = Array(String(repeating: "a", count: 64).unicodeScalars)
        var steps = 0
        #expect(!Glob.matches(pattern, text, steps: &steps))
        #expect(steps <= (pattern.count + 1) * (text.count + 1), "\(steps) steps")
        let long = Array(String(repeating: "a", count: 128).unicodeScalars)
        steps = 0
        #expect(!Glob.matches(Array((String(repeating: "*a", count: 64) + "*b").unicodeScalars), long, steps: &steps))
        #expect(steps <= 130 * 129)
    }
}
