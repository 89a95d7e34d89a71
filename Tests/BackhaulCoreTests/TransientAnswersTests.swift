import BackhaulCore
import Testing

/// One table per protocol (docs/protocols.md, "Transient answers"): each row an answer and whether
/// the protocol's reference client retries it.
@Suite("Transient answers")
struct TransientAnswersTests {
    /// HTTP's own transient statuses (raw, multipart, chunked, downloads).
    static let http: [(Int, Bool)] = [
        (400, false), (403, false), (404, false), (408, true), (409, false), (423, false), (425, true), (429, true),
        (500, true), (501, false), (502, true), (503, true), (504, true), (505, false),
    ]
    /// tus-js-client: anything but a 4xx, and 409 and 423.
    static let tus: [(Int, Bool)] = [
        (301, true), (400, false), (403, false), (404, false), (408, false), (409, true), (410, false), (413, false),
        (423, true), (429, false), (460, false), (500, true), (501, true), (502, true), (503, true), (504, true),
        (599, true),
    ]
    /// The AWS SDKs' standard retry mode: by status, then by error code.
    static let s3: [(Int, String?, Bool)] = [
        (500, nil, true), (502, nil, true), (503, nil, true), (504, nil, true), (501, nil, false), (505, nil, false),
        (400, nil, false), (403, "AccessDenied", false), (404, "NoSuchUpload", false), (429, nil, false),
        (400, "RequestTimeout", true), (400, "RequestTimeoutException", true), (409, "PriorRequestNotComplete", true),
        (500, "InternalError", true), (200, "InternalError", true), (503, "SlowDown", true), (400, "Throttling", true),
        (400, "ThrottlingException", true), (400, "ThrottledException", true), (400, "RequestThrottledException", true),
        (429, "TooManyRequestsException", true), (400, "ProvisionedThroughputExceededException", true),
        (400, "TransactionInProgressException", true), (503, "RequestLimitExceeded", true),
        (509, "BandwidthLimitExceeded", true), (400, "LimitExceededException", true), (400, "RequestThrottled", true),
        (503, "EC2ThrottledException", true), (400, "EntityTooSmall", false), (400, "InvalidPart", false),
    ]
    /// The IETF draft: 503 and 429 with `Retry-After`.
    static let ietf: [(Int, Bool)] = [
        (400, false), (408, false), (409, false), (429, true), (500, false), (502, false), (503, true), (504, false),
    ]

    @Test("http", arguments: http.indices)
    func httpRow(_ index: Int) {
        let (status, transient) = Self.http[index]
        #expect(TransientAnswers.http.isTransient(status: status) == transient, "\(status)")
    }

    @Test("tus, as tus-js-client", arguments: tus.indices)
    func tusRow(_ index: Int) {
        let (status, transient) = Self.tus[index]
        #expect(TransientAnswers.tus.isTransient(status: status) == transient, "\(status)")
    }

    @Test("S3, as the AWS SDKs' standard retry mode", arguments: s3.indices)
    func s3Row(_ index: Int) {
        let (status, code, transient) = Self.s3[index]
        #expect(TransientAnswers.s3.isTransient(status: status, code: code) == transient, "\(status) \(code ?? "")")
    }

    @Test("IETF, as the draft", arguments: ietf.indices)
    func ietfRow(_ index: Int) {
        let (status, transient) = Self.ietf[index]
        #expect(TransientAnswers.ietf.isTransient(status: status) == transient, "\(status)")
    }

    /// What the planner does with a row: a transient answer is retried after the larger of its
    /// `Retry-After` and the backoff; another fails -1011 naming the status.
    @Test("the planner follows the table, and Retry-After is a floor under the backoff")
    func planner() {
        let policy = RetryPolicy(maxAttempts: nil, initialBackoff: 2, maxBackoff: 600)
        func decide(_ failure: AttemptFailure) -> FailureDecision {
            RetryPlanner.decide(failure, attempts: 1, policy: policy, now: 1000, deadline: 1e9, random: { 0.5 })
        }
        #expect(decide(.http(status: 423, retryAfter: nil, answers: .tus)) == .retry(at: 1001))
        #expect(
            decide(.http(status: 423, retryAfter: nil))
                == .fail(TaskError(.badServerResponse, message: "the server answered 423", httpStatus: 423)))
        #expect(decide(.http(status: 503, retryAfter: 30, answers: .ietf)) == .retry(at: 1030))
        #expect(
            decide(.http(status: 500, retryAfter: nil, answers: .ietf))
                == .fail(TaskError(.badServerResponse, message: "the server answered 500", httpStatus: 500)))
        #expect(decide(.http(status: 400, retryAfter: nil, answers: .s3, code: "RequestTimeout")) == .retry(at: 1001))
        #expect(
            decide(.http(status: 403, retryAfter: nil, answers: .s3, code: "AccessDenied"))
                == .fail(TaskError(.badServerResponse, message: "the server answered 403 (AccessDenied)", httpStatus: 403)))
        #expect(decide(.http(status: 401, retryAfter: nil, answers: .tus)) == .authenticationRequired)
    }

    /// The machines read their answers with their own table.
    @Test("each machine names its table, with S3's error code")
    func machines() {
        let tusFailure = TransferStep.failed(ResponseHead(status: 423), now: 0, answers: .tus)
        #expect(tusFailure == .failed(.http(status: 423, retryAfter: nil, answers: .tus)))
        let body = Array("<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>".utf8)
        let s3Failure = TransferStep.failed(
            ResponseHead(status: 503, headers: ["retry-after": "7"], body: body), now: 0, answers: .s3)
        #expect(s3Failure == .failed(.http(status: 503, retryAfter: 7, answers: .s3, code: "SlowDown")))
    }
}
