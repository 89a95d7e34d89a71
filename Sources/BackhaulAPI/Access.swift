import BackhaulCore
import Digest

/// Who is calling, once a bearer token was recognised.
public enum Principal: Sendable, Equatable {
    /// Everything, including `/v1/network`, `/v1/policy` and every session.
    case admin
    /// The sessions whose id matches one of the patterns (shell globs).
    case client([String])

    public func canAccess(session id: String) -> Bool {
        switch self {
        case .admin: return true
        case .client(let patterns): return patterns.contains { Glob.matches($0, id) }
        }
    }
}

/// The API's bearer tokens: from `--token-file` or `BACKHAUL_TOKENS`, one token per line (or per
/// `;` in the variable) as `TOKEN ROLE [SESSION-PATTERN…]`, `#` starting a comment. Tokens are
/// kept as SHA-256 digests and compared in constant time, every entry every time.
public struct AccessTokens: Sendable {
    struct Entry: Sendable {
        var digest: [UInt8]
        var principal: Principal
    }

    let entries: [Entry]

    public struct Invalid: Error, Sendable, CustomStringConvertible {
        public var description: String
    }

    public static let minimumLength = 16

    public init(parsing text: String) throws(Invalid) {
        var entries: [Entry] = []
        let lines = text.split(whereSeparator: { $0 == "\n" || $0 == ";" })
        for (number, raw) in lines.enumerated() {
            let line = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" }).map(String.init)
            guard !fields.isEmpty else { continue }
            guard fields.count >= 2 else {
                throw Invalid(description: "token entry \(number + 1): TOKEN ROLE [SESSION-PATTERN…]")
            }
            guard fields[0].utf8.count >= Self.minimumLength else {
                throw Invalid(description: "token entry \(number + 1): tokens must be at least \(Self.minimumLength) characters")
            }
            let principal: Principal
            switch fields[1] {
            case "admin":
                guard fields.count == 2 else {
                    throw Invalid(description: "token entry \(number + 1): admin tokens take no session patterns")
                }
                principal = .admin
            case "client":
                guard fields.count > 2 else {
                    throw Invalid(description: "token entry \(number + 1): a client token needs session patterns")
                }
                principal = .client(Array(fields.dropFirst(2)))
            default:
                throw Invalid(description: "token entry \(number + 1): the role is admin or client, not \(fields[1])")
            }
            entries.append(Entry(digest: SHA256Hasher.digest(Array(fields[0].utf8)), principal: principal))
        }
        guard !entries.isEmpty else { throw Invalid(description: "no tokens were given") }
        self.entries = entries
    }

    /// The principal of an `Authorization: Bearer …` header, or nil.
    public func principal(authorization: String?) -> Principal? {
        guard let authorization, authorization.count > 7, authorization.prefix(7).lowercased() == "bearer " else { return nil }
        let presented = SHA256Hasher.digest(Array(authorization.dropFirst(7).utf8))
        var found: Principal?
        for entry in entries where HMACSHA256.equal(entry.digest, presented) && found == nil {
            found = entry.principal
        }
        return found
    }
}

/// What a route needs from the caller when tokens are on.
public enum Access: Sendable {
    /// Anyone (health probes).
    case open
    /// Any valid token (handlers narrow what a client sees).
    case authenticated
    /// Admin tokens only.
    case admin
    /// The session named by the `{id}` parameter.
    case session
    /// The session of the task named by `{id}`.
    case task
    /// The session of the webhook subscription named by `{id}`.
    case webhook
}
