/// The sources of the AWS credential chain that may keep a task waiting (the environment's keys
/// and a profile's static keys never do).
public enum AWSCredentialSource: String, Sendable {
    case webIdentity = "web_identity"
    case process
    case container
    case imds
}

/// When the AWS credential chain is asked for keys (docs/credentials.md), as a pure state: what
/// was had, what failed and when to try again. The chain's refresher thread runs the lookups; the
/// engine only reads what this state holds, so it never waits on a source.
///
/// - Keys are used while they are valid; 5 minutes before their `Expiration`
///   (`AWSCredentials.renewalMargin`) a renewal is due, whether or not a task asks, and at most
///   once every `minimumRenewalInterval` (a source whose keys live less than the margin is not
///   asked in a loop).
/// - A lookup that fails is kept: the next one waits out a backoff (1 s, doubling, at most
///   `maximumBackoff`), however many tasks ask meanwhile.
/// - Without valid keys, a lookup is due only while something wants keys (a task asked since the
///   last success), so an idle daemon asks no source.
public struct CredentialRefresh: Sendable, Equatable {
    /// The keys of the last lookup that gave some (kept through failed renewals while valid).
    public private(set) var kept: AWSCredentials?
    /// Lookups failed in a row since the last success, and the last one's words.
    public private(set) var failures = 0
    public private(set) var lastError: String?
    /// Whether a lookup runs now.
    public private(set) var looking = false
    /// Whether something asked for keys that were not there (or due) since the last success.
    public private(set) var wanted = false
    private var retryAt: Timestamp = 0
    /// When the kept keys came.
    private var renewedAt: Timestamp = 0

    /// The longest wait between failed lookups (seconds).
    public static let maximumBackoff: Double = 300
    /// The shortest time between a lookup that gave keys and a renewal of them (seconds).
    public static let minimumRenewalInterval: Double = 5

    public init() {}

    /// Keys to sign with at `now`, or nil when there are none yet (the task waits). Asking marks
    /// keys as wanted when none are usable or a renewal is due.
    public mutating func ask(now: Timestamp) -> AWSCredentials? {
        if let kept, kept.valid(now: now) {
            if kept.due(now: now) { wanted = true }
            return kept
        }
        wanted = true
        return nil
    }

    /// When the next lookup is due (it may be now or past); nil while one runs, or while nothing
    /// wants keys and none are kept to renew. Kept keys are renewed on their own schedule; a
    /// want without keys is served at once, or after the backoff of a failure.
    public func nextLookup() -> Timestamp? {
        guard !looking else { return nil }
        var due: Timestamp?
        if let expiration = kept?.expiration {
            due = max(expiration - AWSCredentials.renewalMargin, renewedAt + Self.minimumRenewalInterval)
        }
        if wanted, kept == nil { due = retryAt }
        return due.map { max($0, failures > 0 ? retryAt : $0) }
    }

    /// A lookup begins.
    public mutating func begin() { looking = true }

    /// The lookup gave keys at `now`.
    public mutating func succeeded(_ keys: AWSCredentials, now: Timestamp) {
        kept = keys
        renewedAt = now
        failures = 0
        lastError = nil
        looking = false
        wanted = false
        retryAt = 0
    }

    /// The lookup failed at `now`: kept keys stay while valid, and the next lookup waits.
    public mutating func failed(_ message: String, now: Timestamp) {
        failures += 1
        lastError = message
        looking = false
        retryAt = now + Self.backoff(failures: failures)
        if let kept, !kept.valid(now: now) { self.kept = nil }
    }

    /// The server said the kept keys expired: they are dropped, and new ones wanted at once
    /// (past any backoff: this is news, not a retry).
    public mutating func invalidate() {
        kept = nil
        wanted = true
        retryAt = 0
    }

    /// The wait after `failures` failed lookups in a row: 1, 2, 4 … seconds, at most
    /// `maximumBackoff`.
    public static func backoff(failures: Int) -> Double {
        var delay = 1.0
        for _ in 1..<max(1, min(failures, 20)) { delay *= 2 }
        return min(delay, maximumBackoff)
    }
}
