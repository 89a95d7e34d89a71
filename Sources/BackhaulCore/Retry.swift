/// How one attempt went wrong, as the retry policy sees it.
public enum AttemptFailure: Sendable, Equatable {
    /// The server answered with a status that does not complete the task. `answers` is the table
    /// of the protocol that read it, and `code` the error code its body named (S3's `<Code>`):
    /// together they say whether a retry may help (`TransientAnswers`).
    case http(status: Int, retryAfter: Double?, answers: TransientAnswers = .http, code: String? = nil)
    /// The server said the credentials or the signed URL expired (S3 `ExpiredToken`,
    /// `TokenRefreshRequired`, `AccessDenied` "Request has expired"): new ones are wanted, as
    /// after a 401.
    case credentialsExpired(status: Int)
    /// The server said they expired, and the task's own source of them (its session's signer, the
    /// AWS credential chain) is asked for new ones: retried with backoff, and shown as the expiry
    /// it is (`-1013`, `credentials_expired`), not as a network failure.
    case credentialsRenewed(status: Int, message: String)
    /// The server computed a different checksum of the body than the one sent with it (tus 460,
    /// S3 `BadDigest`): the bytes were damaged on the way, so the piece is sent again.
    case checksumMismatch(status: Int)
    /// The transfer itself failed.
    case transport(TransportFailure, message: String)
    /// A failure that no retry can fix (file gone, file changed, protocol limits).
    case fatal(TaskError)
}

/// Transport failures, mapped from the HTTP client's codes by the engine.
public enum TransportFailure: Sendable, Equatable {
    case cannotFindHost, cannotConnect, connectionLost, timedOut, secureConnectionFailed, other

    /// The OpenAPI/backhaul.yaml error when retries run out.
    public var errorKind: TaskError.Kind {
        switch self {
        case .cannotFindHost: return .cannotFindHost
        case .cannotConnect: return .cannotConnectToHost
        case .connectionLost, .other: return .networkConnectionLost
        case .timedOut: return .timedOut
        case .secureConnectionFailed: return .secureConnectionFailed
        }
    }

    /// TLS failures (bad certificates) do not heal by waiting.
    public var isTransient: Bool { self != .secureConnectionFailed }
}

/// What to do with a task after a failed attempt.
public enum FailureDecision: Sendable, Equatable {
    case retry(at: Timestamp)
    case fail(TaskError)
    case authenticationRequired
}

/// Which answers of a peer are transient (retried with backoff), one table per protocol, each as
/// that protocol's reference client reads them (docs/protocols.md, "Transient answers"). A
/// transport failure (no answer at all) is transient in every table; 401 and an expiry are
/// asked for new credentials before any table is read.
public enum TransientAnswers: Sendable, Equatable {
    /// HTTP's own transient statuses: raw, multipart, chunked and downloads.
    case http
    /// tus-js-client's `defaultOnShouldRetry`: anything but a 4xx, and 409 and 423 among those
    /// (a `423 Locked` is a server still holding the lock of a request that died).
    case tus
    /// The AWS SDKs' standard retry mode: 500, 502, 503, 504, and the transient and throttling
    /// error codes, whatever their status.
    case s3
    /// draft-ietf-httpbis-resumable-upload: 503 and 429, with their `Retry-After`.
    case ietf

    /// HTTP statuses transient for `http` (OpenAPI/backhaul.yaml).
    public static let httpStatuses: Set<Int> = [408, 425, 429, 500, 502, 503, 504]
    /// The statuses tus-js-client retries although they are 4xx.
    public static let tusRetried4xx: Set<Int> = [409, 423]
    /// The AWS SDKs' transient statuses (standard mode).
    public static let s3Statuses: Set<Int> = [500, 502, 503, 504]
    /// The AWS SDKs' transient error codes (standard mode), S3's `InternalError` among them.
    public static let s3TransientCodes: Set<String> = [
        "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete", "InternalError",
    ]
    /// The AWS SDKs' throttling error codes (standard mode).
    public static let s3ThrottlingCodes: Set<String> = [
        "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
        "TooManyRequestsException", "ProvisionedThroughputExceededException", "TransactionInProgressException",
        "RequestLimitExceeded", "BandwidthLimitExceeded", "LimitExceededException", "RequestThrottled", "SlowDown",
        "EC2ThrottledException",
    ]
    /// The statuses the draft says to retry after `Retry-After`.
    public static let ietfStatuses: Set<Int> = [429, 503]

    /// Whether an answer with `status` (and, for S3, the error `code` its body named) is worth a
    /// retry.
    public func isTransient(status: Int, code: String? = nil) -> Bool {
        switch self {
        case .http: return Self.httpStatuses.contains(status)
        case .tus: return !(400..<500).contains(status) || Self.tusRetried4xx.contains(status)
        case .s3:
            if Self.s3Statuses.contains(status) { return true }
            guard let code else { return false }
            return Self.s3TransientCodes.contains(code) || Self.s3ThrottlingCodes.contains(code)
        case .ietf: return Self.ietfStatuses.contains(status)
        }
    }
}

public enum RetryPlanner {

    /// Decides after attempt number `attempts` (1-based) failed. `random` gives a uniform
    /// value in 0..<1 for the full jitter. A retry past the deadline is not planned: the
    /// resource timeout ends the task instead.
    public static func decide(
        _ failure: AttemptFailure, attempts: Int, policy: RetryPolicy, now: Timestamp,
        deadline: Timestamp, random: () -> Double
    ) -> FailureDecision {
        let exhausted = policy.maxAttempts.map { attempts >= $0 } ?? false
        switch failure {
        case .fatal(let error):
            return .fail(error)
        case .http(401, _, _, _), .credentialsExpired:
            return .authenticationRequired
        case .http(let status, let retryAfter, let answers, let code):
            let error = failure.error
            guard answers.isTransient(status: status, code: code), !exhausted else { return .fail(error) }
            return schedule(
                attempts: attempts, policy: policy, retryAfter: retryAfter, now: now, deadline: deadline,
                random: random)
                ?? .fail(TaskError(.timedOut, message: "the resource timeout ends before the next attempt", httpStatus: status))
        case .credentialsRenewed:
            guard !exhausted else { return .fail(failure.error) }
            return schedule(attempts: attempts, policy: policy, retryAfter: nil, now: now, deadline: deadline, random: random)
                ?? .fail(failure.error)
        case .checksumMismatch(let status):
            let error = TaskError(
                .badServerResponse, message: "the server's checksum of the body did not match the one sent (\(status))",
                httpStatus: status)
            guard !exhausted else { return .fail(error) }
            return schedule(attempts: attempts, policy: policy, retryAfter: nil, now: now, deadline: deadline, random: random)
                ?? .fail(error)
        case .transport(let kind, let message):
            let error = TaskError(kind.errorKind, message: message)
            guard kind.isTransient, !exhausted else { return .fail(error) }
            return schedule(
                attempts: attempts, policy: policy, retryAfter: nil, now: now, deadline: deadline,
                random: random) ?? .fail(TaskError(.timedOut, message: "the resource timeout ends before the next attempt"))
        }
    }

    private static func schedule(
        attempts: Int, policy: RetryPolicy, retryAfter: Double?, now: Timestamp,
        deadline: Timestamp, random: () -> Double
    ) -> FailureDecision? {
        let delay = max(retryAfter ?? 0, Backoff.fullJitter(attempt: attempts, policy: policy, random: random))
        let at = now + delay
        return at < deadline ? .retry(at: at) : nil
    }
}

public enum Backoff {
    /// Full jitter: uniform in 0..<min(max, initial × 2^(attempt−1)).
    public static func fullJitter(attempt: Int, policy: RetryPolicy, random: () -> Double) -> Double {
        let exponent = Double(max(0, min(attempt - 1, 60)))
        let ceiling = min(policy.maxBackoff, policy.initialBackoff * pow2(exponent))
        return ceiling * random()
    }

    private static func pow2(_ exponent: Double) -> Double {
        var result = 1.0
        var remaining = Int(exponent)
        while remaining > 0 {
            result *= 2
            remaining -= 1
        }
        return result
    }
}

public enum RetryAfter {
    /// `Retry-After` as seconds from `now`: delta-seconds or an IMF-fixdate; nil when unreadable.
    public static func parse(_ value: String, now: Timestamp) -> Double? {
        let trimmed = value.trimmed()
        if let seconds = Int(trimmed) { return seconds >= 0 ? Double(seconds) : nil }
        // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
        let parts = trimmed.split(separator: " ")
        guard parts.count == 6, parts[5] == "GMT", let day = Int(parts[1]), let year = Int(parts[3]) else { return nil }
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        guard let month = months.firstIndex(of: String(parts[2])) else { return nil }
        let time = parts[4].split(separator: ":").compactMap { Int($0) }
        guard time.count == 3 else { return nil }
        func pad(_ value: Int) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let text = "\(year)-\(pad(month + 1))-\(pad(day))T\(pad(time[0])):\(pad(time[1])):\(pad(time[2]))Z"
        guard let date = RFC3339.parse(text) else { return nil }
        return max(0, date - now)
    }
}
