import BackhaulCore
import Testing

/// When the AWS credential chain looks up keys (docs/credentials.md), as a pure state.
@Suite("Credential refresh")
struct CredentialRefreshTests {
    static let temporary = AWSCredentials(accessKeyID: "ASIA1", secretAccessKey: "s", sessionToken: "t", expiration: 10_000)
    static let lasting = AWSCredentials(accessKeyID: "AKIA1", secretAccessKey: "s")

    @Test("nothing is looked up until something asks; the first ask finds nothing and makes a lookup due now")
    func firstAsk() {
        var refresh = CredentialRefresh()
        #expect(refresh.nextLookup() == nil)
        #expect(refresh.ask(now: 100) == nil)
        #expect(refresh.nextLookup() == 0)
        refresh.begin()
        #expect(refresh.nextLookup() == nil, "one lookup at a time")
        refresh.succeeded(Self.temporary, now: 100)
        #expect(refresh.ask(now: 101) == Self.temporary)
    }

    @Test("temporary keys: used until they expire, renewed from 5 minutes before, whether asked or not")
    func renewal() {
        var refresh = CredentialRefresh()
        refresh.succeeded(Self.temporary, now: 100)
        #expect(refresh.nextLookup() == 9_700)
        #expect(refresh.ask(now: 9_699) == Self.temporary)
        #expect(refresh.ask(now: 9_701) == Self.temporary, "due, still valid: used meanwhile")
        #expect(refresh.nextLookup() == 9_700, "due since 9,700")
        refresh.begin()
        refresh.failed("STS answered 503", now: 9_702)
        #expect(refresh.ask(now: 9_703) == Self.temporary, "a failed renewal keeps the valid keys")
        #expect(refresh.nextLookup() == 9_703, "after a 1 s backoff")
        #expect(refresh.ask(now: 10_000) == nil, "expired")
        refresh.begin()
        refresh.failed("STS answered 503", now: 10_001)
        #expect(refresh.kept == nil)
        #expect(refresh.nextLookup() == 10_003, "2 s after the second failure")
    }

    @Test("keys that come already within the margin are renewed at most every 5 s, not in a loop")
    func shortLived() {
        var refresh = CredentialRefresh()
        let brief = AWSCredentials(accessKeyID: "ASIA2", secretAccessKey: "s", sessionToken: "t", expiration: 1_011)
        refresh.succeeded(brief, now: 1_000)
        #expect(refresh.ask(now: 1_001) == brief)
        #expect(refresh.nextLookup() == 1_005)
    }

    @Test("keys without Expiration are never looked up again, unless invalidated")
    func lasting() {
        var refresh = CredentialRefresh()
        refresh.succeeded(Self.lasting, now: 0)
        #expect(refresh.ask(now: 1e9) == Self.lasting)
        #expect(refresh.nextLookup() == nil)
        refresh.invalidate()
        #expect(refresh.ask(now: 1e9) == nil)
        #expect(refresh.nextLookup() == 0, "at once")
    }

    @Test("failures are kept: each waits out a doubling backoff, however often asked, at most 5 minutes")
    func backoff() {
        var refresh = CredentialRefresh()
        _ = refresh.ask(now: 0)
        var now = 0.0
        var waits: [Double] = []
        for _ in 0..<12 {
            refresh.begin()
            refresh.failed("the container endpoint cannot be reached", now: now)
            for _ in 0..<100 { #expect(refresh.ask(now: now) == nil) }
            let next = refresh.nextLookup() ?? -1
            waits.append(next - now)
            now = next
        }
        #expect(waits == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300])
        #expect(refresh.failures == 12 && refresh.lastError == "the container endpoint cannot be reached")
        refresh.begin()
        refresh.succeeded(Self.lasting, now: 0)
        #expect(refresh.failures == 0 && refresh.lastError == nil && refresh.nextLookup() == nil)
    }

    @Test("invalidating after an ExpiredToken skips a backoff under way")
    func invalidateSkipsBackoff() {
        var refresh = CredentialRefresh()
        _ = refresh.ask(now: 0)
        refresh.begin()
        refresh.failed("no answer", now: 0)
        #expect(refresh.nextLookup() == 1)
        refresh.invalidate()
        #expect(refresh.nextLookup() == 0)
    }
}
