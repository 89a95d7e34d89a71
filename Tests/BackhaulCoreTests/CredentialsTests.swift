import BackhaulCore
import JSONCodec
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

@Suite("Expired credentials")
struct CredentialExpiryTests {
    static func s3Error(_ code: String, _ message: String) -> [UInt8] {
        Array(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>\(code)</Code><Message>\(message)</Message></Error>".utf8)
    }

    /// (status, body, what the attempt's failure is)
    static let rows: [(Int, [UInt8], AttemptFailure)] = [
        (403, s3Error("AccessDenied", "Request has expired"), .credentialsExpired(status: 403)),
        (403, s3Error("ExpiredToken", "The provided token has expired."), .credentialsExpired(status: 403)),
        (400, s3Error("ExpiredToken", "The provided token has expired."), .credentialsExpired(status: 400)),
        (400, s3Error("TokenRefreshRequired", "The provided token must be refreshed."), .credentialsExpired(status: 400)),
        (403, s3Error("AccessDenied", "Access Denied"), .http(status: 403, retryAfter: nil)),
        (403, s3Error("SignatureDoesNotMatch", "Request has expired"), .http(status: 403, retryAfter: nil)),
        (400, s3Error("AccessDenied", "Request has expired"), .http(status: 400, retryAfter: nil)),
        (403, [], .http(status: 403, retryAfter: nil)),
        (403, Array("Request has expired".utf8), .http(status: 403, retryAfter: nil)),
        (401, s3Error("ExpiredToken", "expired"), .http(status: 401, retryAfter: nil)),
    ]

    @Test("a refusal saying the credentials expired is told apart from others", arguments: rows.indices)
    func recognised(_ index: Int) {
        let (status, body, expected) = Self.rows[index]
        #expect(TransferStep.failed(ResponseHead(status: status, body: body), now: 0) == .failed(expected))
    }

    @Test("expiry and a 401 both want new credentials; the task says which")
    func reasons() throws {
        let policy = RetryPolicy(maxAttempts: nil, initialBackoff: 2, maxBackoff: 600)
        for failure in [AttemptFailure.credentialsExpired(status: 403), .http(status: 401, retryAfter: nil)] {
            #expect(
                RetryPlanner.decide(failure, attempts: 1, policy: policy, now: 0, deadline: 1e9, random: { 0.5 })
                    == .authenticationRequired)
        }
        #expect(AttemptFailure.credentialsExpired(status: 403).error.reason == .credentialsExpired)
        #expect(AttemptFailure.credentialsExpired(status: 403).error.code == -1013)
        #expect(AttemptEnd.authenticationRequired(nil).error?.reason == nil)
        #expect(AttemptEnd.authenticationRequired(nil, expired: true).error?.reason == .credentialsExpired)
    }
}

extension CredentialExpiryTests {
    @Test("auth.reason follows the attempt that led to auth_required; the resource timeout keeps it")
    func authReasonOfTheTask() throws {
        var task = TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/f", size: 100, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: "http://h/x", method: "PUT"), upload: UploadSpec(), createdAt: 0, deadlineAt: 5_000)
        task.state = .running
        task.attempts = 1
        let expired = try task.applying(
            .attemptEnded(attempt: 1, bytesTransferred: 0, .authenticationRequired(nil, expired: true)), now: 10
        ).get()
        #expect(expired.state == .authRequired)
        #expect(expired.authReason == .credentialsExpired)
        #expect(expired.jsonText().contains("\"auth\":{\"reason\":\"credentials_expired\"}"))
        let timedOut = try expired.applying(.deadlinePassed, now: 5_000).get()
        #expect(timedOut.error?.reason == .credentialsExpired)
        #expect(!timedOut.jsonText().contains("\"auth\""))
        let unauthorized = try task.applying(
            .attemptEnded(attempt: 1, bytesTransferred: 0, .authenticationRequired(nil)), now: 10
        ).get()
        #expect(unauthorized.authReason == .unauthorized)
        #expect(unauthorized.jsonText().contains("\"auth\":{\"reason\":\"unauthorized\"}"))
    }
}

@Suite("AWS credential sources")
struct AWSCredentialSourceTests {
    @Test("the container endpoint's and credential_process's answers")
    func answers() throws {
        let container = try JSON.parse(
            #"{"AccessKeyId":"ASIA1","SecretAccessKey":"s","Token":"t","Expiration":"2026-11-27T10:00:00Z"}"#)
        let keys = try #require(AWSCredentials.fromContainerAnswer(container))
        #expect(keys.sessionToken == "t" && keys.expiration == RFC3339.parse("2026-11-27T10:00:00Z"))
        let expiration = try #require(keys.expiration)
        #expect(!keys.due(now: expiration - 301) && keys.due(now: expiration - 299))
        #expect(keys.valid(now: expiration - 1) && !keys.valid(now: expiration))
        let process = try JSON.parse(#"{"Version":1,"AccessKeyId":"AKIA1","SecretAccessKey":"s","SessionToken":"t2"}"#)
        #expect(AWSCredentials.fromProcessOutput(process)?.sessionToken == "t2")
        #expect(AWSCredentials.fromProcessOutput(process)?.due(now: 1e12) == false)
        #expect(
            AWSCredentials.fromProcessOutput(try JSON.parse(#"{"Version":2,"AccessKeyId":"a","SecretAccessKey":"s"}"#)) == nil)
        #expect(AWSCredentials.fromContainerAnswer(try JSON.parse(#"{"AccessKeyId":"a"}"#)) == nil)
        #expect(
            AWSCredentials.fromContainerAnswer(try JSON.parse(#"{"AccessKeyId":"a","SecretAccessKey":"s","Expiration":"soon"}"#))
                == nil)
    }

    @Test("profiles of the shared credentials and config files")
    func sharedFiles() {
        let credentials = """
            # comment
            [default]
            aws_access_key_id = AKIADEFAULT
            aws_secret_access_key = secret1

            [work]
            aws_access_key_id=AKIAWORK
            aws_secret_access_key=secret2
            aws_session_token = token2
            """
        #expect(
            AWSSharedFiles.profile("default", in: credentials, config: false).flatMap(AWSSharedFiles.keys)?.accessKeyID
                == "AKIADEFAULT")
        #expect(
            AWSSharedFiles.profile("work", in: credentials, config: false).flatMap(AWSSharedFiles.keys)?.sessionToken == "token2")
        #expect(AWSSharedFiles.profile("none", in: credentials, config: false) == nil)
        let config = """
            [default]
            region = us-east-1
            [profile  edge]
            credential_process = /usr/local/bin/get-keys --role edge
            ; comment
            """
        #expect(
            AWSSharedFiles.profile("edge", in: config, config: true)?["credential_process"]
                == "/usr/local/bin/get-keys --role edge")
        #expect(AWSSharedFiles.profile("edge", in: config, config: false) == nil)
        #expect(AWSSharedFiles.profile("default", in: config, config: true).flatMap(AWSSharedFiles.keys) == nil)
    }

    @Test("an s3 task may give a region only: its keys then come from the chain")
    func regionOnly() throws {
        let chain = try UploadSpec.decode(JSON.parse(#"{"protocol":"s3","s3":{"region":"eu-west-1"}}"#))
        #expect(chain.s3?.isFromChain == true)
        #expect(throws: ValidationError.self) {
            try UploadSpec.decode(JSON.parse(#"{"protocol":"s3","s3":{"region":"eu-west-1","secret_access_key":"s"}}"#))
        }
        let given = try UploadSpec.decode(
            JSON.parse(#"{"protocol":"s3","s3":{"region":"eu-west-1","access_key_id":"AKIA","secret_access_key":"s"}}"#))
        #expect(given.s3?.isFromChain == false)
    }
}
