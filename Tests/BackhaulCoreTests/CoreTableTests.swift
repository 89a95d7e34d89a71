import BackhaulCore
import Dispatch
import JSONCodec
import Synchronization
import Testing

@Suite("Task states")
struct TaskStateTests {
    static let rows: [(TaskState, TaskCommand, TaskState?)] = [
        (.queued, .cancel, .cancelled), (.waiting, .cancel, .cancelled), (.running, .cancel, .cancelled),
        (.retrying, .cancel, .cancelled), (.suspended, .cancel, .cancelled), (.authRequired, .cancel, .cancelled),
        (.completed, .cancel, nil), (.failed, .cancel, nil), (.cancelled, .cancel, nil),
        (.queued, .suspend, .suspended), (.running, .suspend, .suspended), (.retrying, .suspend, .suspended),
        (.waiting, .suspend, .suspended), (.authRequired, .suspend, .suspended), (.suspended, .suspend, .suspended),
        (.completed, .suspend, nil),
        (.suspended, .resume, .queued), (.queued, .resume, nil), (.running, .resume, nil), (.failed, .resume, nil),
    ]

    @Test("client commands", arguments: rows.indices)
    func command(_ index: Int) {
        let (state, command, expected) = Self.rows[index]
        switch state.applying(command) {
        case .success(let next): #expect(next == expected, "\(state) + \(command)")
        case .failure: #expect(expected == nil, "\(state) + \(command) was refused")
        }
    }

    @Test("final states")
    func finals() {
        #expect(TaskState.allCases.filter(\.isFinal) == [.completed, .failed, .cancelled])
        #expect(TaskState.unfinished.count == 6)
    }
}

@Suite("Retry planning")
struct RetryTests {
    let policy = RetryPolicy(maxAttempts: nil, initialBackoff: 2, maxBackoff: 600)

    func decide(
        _ failure: AttemptFailure, attempts: Int = 1, policy: RetryPolicy? = nil, deadline: Double = 1e9,
        random: Double = 0.5
    ) -> FailureDecision {
        RetryPlanner.decide(
            failure, attempts: attempts, policy: policy ?? self.policy, now: 1000, deadline: deadline,
            random: { random })
    }

    @Test(
        "transient statuses retry, others fail -1011",
        arguments: [200, 301, 400, 403, 404, 405, 408, 409, 410, 413, 422, 425, 429, 500, 501, 502, 503, 504, 505])
    func statuses(_ status: Int) {
        let decision = decide(.http(status: status, retryAfter: nil))
        if [408, 425, 429, 500, 502, 503, 504].contains(status) {
            #expect(decision == .retry(at: 1001))
        } else {
            #expect(
                decision == .fail(TaskError(.badServerResponse, message: "the server answered \(status)", httpStatus: status)))
        }
    }

    @Test("401 asks for authentication")
    func unauthorized() {
        #expect(decide(.http(status: 401, retryAfter: nil)) == .authenticationRequired)
    }

    @Test("a checksum mismatch is sent again, and fails -1011 when attempts run out")
    func checksumMismatch() {
        #expect(decide(.checksumMismatch(status: 460)) == .retry(at: 1001))
        let limited = RetryPolicy(maxAttempts: 3, initialBackoff: 2, maxBackoff: 600)
        guard case .fail(let error) = decide(.checksumMismatch(status: 400), attempts: 3, policy: limited) else {
            Issue.record("expected a failure")
            return
        }
        #expect(error.code == -1011 && error.httpStatus == 400)
    }

    @Test("credentials renewed by the task's signer or chain: retried, shown -1013 credentials_expired with the status")
    func credentialsRenewed() {
        let words = "the signed request expired; the signer is asked again"
        let failure = AttemptFailure.credentialsRenewed(status: 403, message: words)
        #expect(decide(failure) == .retry(at: 1001))
        let expected = TaskError(
            .userAuthenticationRequired, message: "the server answered 403: \(words)", httpStatus: 403,
            reason: .credentialsExpired)
        #expect(failure.error == expected)
        let limited = RetryPolicy(maxAttempts: 2, initialBackoff: 2, maxBackoff: 600)
        #expect(decide(failure, attempts: 2, policy: limited) == .fail(expected), "not endlessly: max_attempts bounds it")
    }

    @Test("Retry-After wins over a shorter backoff")
    func retryAfter() {
        #expect(decide(.http(status: 503, retryAfter: 30)) == .retry(at: 1030))
    }

    @Test(
        "exhausted attempts fail with the failure's own code",
        arguments: [
            (TransportFailure.cannotFindHost, -1003), (.cannotConnect, -1004), (.connectionLost, -1005), (.timedOut, -1001),
            (.other, -1005),
        ])
    func exhausted(_ failure: TransportFailure, _ code: Int) {
        let limited = RetryPolicy(maxAttempts: 3, initialBackoff: 2, maxBackoff: 600)
        guard case .fail(let error) = decide(.transport(failure, message: "x"), attempts: 3, policy: limited) else {
            Issue.record("expected a failure")
            return
        }
        #expect(error.code == code)
        #expect(decide(.transport(failure, message: "x"), attempts: 2, policy: limited) == .retry(at: 1002))
    }

    @Test("TLS failures are not retried")
    func tls() {
        guard case .fail(let error) = decide(.transport(.secureConnectionFailed, message: "bad cert")) else {
            Issue.record("expected a failure")
            return
        }
        #expect(error.code == -1200)
    }

    @Test("a retry past the resource deadline fails -1001")
    func deadline() {
        guard case .fail(let error) = decide(.http(status: 503, retryAfter: 60), deadline: 1010) else {
            Issue.record("expected a failure")
            return
        }
        #expect(error.code == -1001)
    }

    @Test("file errors are final")
    func fatal() {
        let error = TaskError(.fileChanged, message: "changed")
        #expect(decide(.fatal(error)) == .fail(error))
    }

    @Test("full jitter stays under min(max, initial × 2^(n−1))", arguments: 1...12)
    func backoff(_ attempt: Int) {
        let ceiling = min(600, 2 * Double(1 << (attempt - 1)))
        #expect(Backoff.fullJitter(attempt: attempt, policy: policy, random: { 0.999999 }) <= ceiling)
        #expect(Backoff.fullJitter(attempt: attempt, policy: policy, random: { 0 }) == 0)
        #expect(abs(Backoff.fullJitter(attempt: attempt, policy: policy, random: { 0.5 }) - ceiling / 2) < 1e-9)
    }

    @Test("Retry-After: seconds and HTTP dates")
    func retryAfterParsing() {
        #expect(RetryAfter.parse("120", now: 0) == 120)
        #expect(RetryAfter.parse(" 5 ", now: 0) == 5)
        #expect(RetryAfter.parse("-1", now: 0) == nil)
        #expect(RetryAfter.parse("soon", now: 0) == nil)
        let now = RFC3339.parse("1994-11-06T08:49:00Z")!
        #expect(RetryAfter.parse("Sun, 06 Nov 1994 08:49:37 GMT", now: now) == 37)
    }
}

@Suite("Configuration, headers, URLs, times")
struct ConfigurationTests {
    @Test("defaults match the SPEC")
    func defaults() {
        let configuration = TransferConfiguration()
        #expect(configuration.allowsCellularAccess && configuration.allowsExpensiveNetworkAccess)
        #expect(configuration.allowsConstrainedNetworkAccess && configuration.waitsForConnectivity)
        #expect(!configuration.discretionary)
        #expect(configuration.timeoutIntervalForRequest == 60)
        #expect(configuration.timeoutIntervalForResource == 604_800)
        #expect(configuration.maxConnectionsPerHost == 6)
        #expect(configuration.retry == RetryPolicy(maxAttempts: nil, initialBackoff: 2, maxBackoff: 600))
    }

    @Test("overrides merge; retry and headers merge member by member")
    func overrides() throws {
        let base = try TransferConfiguration().applying(["retry": ["max_attempts": 5], "default_headers": ["X-A": "1"]])
        let merged = try base.applying([
            "retry": ["initial_backoff": 1], "default_headers": ["x-a": "2", "X-B": "3"],
            "allows_cellular_access": false,
        ])
        #expect(merged.retry.maxAttempts == 5)
        #expect(merged.retry.initialBackoff == 1)
        #expect(!merged.allowsCellularAccess)
        #expect(merged.defaultHeaders.map { $0.1 } == ["2", "3"])
        #expect(try TransferConfiguration().applying(merged.json) == merged)
    }

    @Test(
        "bad configuration is refused with the field named",
        arguments: [
            (#"{"allows_cellular_access": "yes"}"#, "configuration.allows_cellular_access"),
            (#"{"timeout_interval_for_request": 0}"#, "configuration.timeout_interval_for_request"),
            (#"{"max_connections_per_host": 0}"#, "configuration.max_connections_per_host"),
            (#"{"retry": {"max_attempts": 1.5}}"#, "configuration.retry.max_attempts"),
            (#"{"retry": {"initial_backoff": 10, "max_backoff": 1}}"#, "configuration.retry.max_backoff"),
            (#"{"colour": 1}"#, "configuration.colour"),
            (#"{"default_headers": {"Content-Length": "1"}}"#, "configuration.default_headers.Content-Length"),
            (#"{"default_headers": {"X-A": "a\r\nb"}}"#, "configuration.default_headers.X-A"),
        ])
    func invalid(_ text: String, _ field: String) throws {
        let value = try JSON.parse(text)
        #expect(throws: ValidationError.self) { try TransferConfiguration().applying(value) }
        do {
            _ = try TransferConfiguration().applying(value)
        } catch {
            #expect(error.field == field)
        }
    }

    @Test(
        "secret headers are recognised",
        arguments: [
            ("Authorization", true), ("proxy-authorization", true), ("Cookie", true), ("X-Api-Key", true),
            ("X-Auth-Token", true), ("X-Amz-Signature", true), ("X-Password", true), ("client_secret", true),
            ("Content-Type", false), ("X-Trace", false), ("Accept", false),
        ])
    func secrets(_ name: String, _ secret: Bool) {
        #expect(HeaderRules.isSecret(name) == secret)
    }

    @Test(
        "response headers hidden where a response is shown: the secrets and the cookies a server sets",
        arguments: [
            ("Set-Cookie", true), ("SET-COOKIE", true), ("set-cookie2", false), ("X-Session-Token", true),
            ("Authorization", true), ("authorizations", false), ("Etag", false), ("Location", false), ("", false),
        ])
    func hiddenInResponse(_ name: String, _ hidden: Bool) {
        #expect(HeaderRules.isHiddenInResponse(name) == hidden)
    }

    @Test(
        "URL parts",
        arguments: [
            ("http://example.com/a", "http://example.com:80"), ("https://EXAMPLE.com", "https://example.com:443"),
            ("http://127.0.0.1:8080/x?y", "http://127.0.0.1:8080"), ("http://user:pw@h:1/", "http://h:1"),
            ("http://[::1]:9000/p", "http://[::1]:9000"), ("HTTPS://Host.Example#frag", "https://host.example:443"),
            ("http://a@b@h/x", "http://h:80"), ("http://h:65535", "http://h:65535"), ("http://[FE80::1]", "http://[fe80::1]:80"),
            ("https://bücher.example/x", "https://bücher.example:443"), ("https://ÄRGER.example", "https://ärger.example:443"),
        ])
    func urls(_ url: String, _ key: String) {
        #expect(URLParts(url)?.hostKey == key)
    }

    @Test(
        "non-http URLs are refused",
        arguments: [
            "ftp://x/", "file:///etc/passwd", "http://", "http://h:99999/", "h/x", "http://a b/", "http://h:0", "http://h:",
            "http://h:+80", "http://[::1", "http://[::1]x", "http://a\nb/", "http://a\u{2028}b/", "http://a\u{85}b", "http://:80",
            "http://@/",
        ])
    func badURLs(_ url: String) {
        #expect(URLParts(url) == nil)
    }

    @Test(
        "a stored response: secrets and cookies redacted, a repeated header's last value in its first place, binary bodies in base64"
    )
    func responseJSON() throws {
        let headers = [
            ("Set-Cookie", "a=1"), ("X-Count", "1"), ("Set-Cookie", "b=2"), ("Authorization", "Bearer t"), ("X-Count", "2"),
            ("Location", "/u/1"),
        ]
        let text = ResponseRecord(status: 201, headers: headers, body: Array("créé".utf8)).jsonText
        #expect(
            text
                == #"{"status":201,"headers":{"Set-Cookie":"[redacted]","X-Count":"2","Authorization":"[redacted]","Location":"/u/1"},"body":"créé","body_encoding":"utf8"}"#
        )
        let binary = ResponseRecord(status: 200, headers: [], body: [0xff, 0x00, 0x41])
        let parsed = try JSON.parse(binary.jsonText)
        #expect(parsed["body_encoding"] == "base64" && parsed["body"] == "/wBB")
        #expect(ResponseRecord.decode(parsed) == binary)
    }

    @Test("a stored response: names that differ in case are different headers; an empty body is text; 64 KiB of body kept")
    func responseJSONEdges() throws {
        let headers = [("ETag", "\"1\""), ("etag", "\"2\""), ("ETag", "\"3\""), ("Date", "d"), ("date", "e"), ("Date", "f")]
        #expect(
            ResponseRecord(status: 200, headers: headers, body: []).jsonText
                == #"{"status":200,"headers":{"ETag":"\"3\"","etag":"\"2\"","Date":"f","date":"e"},"body":"","body_encoding":"utf8"}"#
        )
        let long = ResponseRecord(status: 500, headers: [], body: Array(repeating: 0x41, count: ResponseRecord.maxBodyBytes + 1))
        #expect(long.body.count == ResponseRecord.maxBodyBytes)
        #expect(try JSON.parse(long.jsonText)["body"]?.stringValue?.utf8.count == ResponseRecord.maxBodyBytes)
    }

    /// A response head as the protocols read it: names lower-cased (ASCII byte by byte, others as
    /// Unicode lower-cases them), the last value of a name repeated in any case kept.
    @Test("a response head from the headers as received")
    func responseHeadFromReceivedHeaders() {
        let head = ResponseHead(
            status: 201,
            received: [("Location", "/a"), ("X-Count", "1"), ("x-count", "2 "), ("Ärger", "ja"), ("Empty", "")], body: [1])
        #expect(head.status == 201 && head.body == [1])
        #expect(head.headers == ["location": "/a", "x-count": "2 ", "ärger": "ja", "empty": ""])
        #expect(ResponseHead(status: 204, received: []).headers.isEmpty)
    }

    /// The random words come from one pool shared by every thread: ids made at once, in the same
    /// millisecond, on several threads, are still all different.
    @Test("ids made on several threads at once are all different")
    func randomIDsAcrossThreads() {
        let made = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 4) { _ in
            let ids = (0..<5_000).map { _ in RandomID.make(prefix: "tsk_", at: 1_795_312_800) }
            made.withLock { $0 += ids }
        }
        #expect(Set(made.withLock { $0 }).count == 20_000)
    }

    @Test("ids: the prefix, 9 characters of the time that sort as it does, 15 random ones; no two alike in 20,000")
    func randomIDs() {
        var seen = Set<String>()
        for prefix in ["tsk_", "msg_", ""] {
            var previous = ""
            for index in 0..<(20_000 / 3) {
                // A millisecond apart every seven ids.
                let id = RandomID.make(prefix: prefix, at: 1_795_312_800 + Double(index / 7) / 1000)
                #expect(id.hasPrefix(prefix) && id.utf8.count == prefix.utf8.count + 24)
                #expect(id.dropFirst(prefix.count).allSatisfy { "abcdefghijklmnopqrstuvwxyz234567".contains($0) })
                let time = String(id.dropFirst(prefix.count).prefix(9))
                #expect(time >= previous, "ids made later sort after")
                previous = time
                seen.insert(String(id.dropFirst(prefix.count)))
            }
        }
        #expect(seen.count == 3 * (20_000 / 3))
        // The random part: every position takes more than one value (no stuck bits).
        let ids = seen.map { Array($0.utf8) }
        for position in 9..<24 { #expect(Set(ids.map { $0[position] }).count > 16) }
        // The time part orders by time, a millisecond apart and across years.
        let times: [Timestamp] = [0, 0.001, 1_795_312_800, 1_795_312_800.001, 4_102_444_800]
        let made = times.map { String(RandomID.make(prefix: "", at: $0).prefix(9)) }
        #expect(made == made.sorted() && Set(made).count == times.count)
    }

    /// A batch's tasks all carry the time of its request: their ids sort in the order they were
    /// made, so the indexes over them grow at their end (random ids of one millisecond went in all
    /// over a batch's part of the index).
    @Test("a series of ids made at one time sorts in the order made; the random tail differs")
    func randomIDSeries() {
        var series = RandomID.Series(prefix: "tsk_", at: 1_795_312_800.0004)
        let ids = (0..<2_000).map { _ in series.next() }
        #expect(ids == ids.sorted())
        #expect(Set(ids).count == ids.count)
        #expect(ids.allSatisfy { $0.utf8.count == 28 && $0.hasPrefix(ids[0].prefix(13)) }, "one millisecond")
        #expect(Set(ids.map { $0.suffix(3) }).count > 100, "three random characters at the end")
        // Two series of the same millisecond start apart.
        var other = RandomID.Series(prefix: "tsk_", at: 1_795_312_800.0004)
        #expect(other.next().dropLast(3) != ids[0].dropLast(3))
    }

    @Test(
        "header names and hosts lower-cased: ASCII byte by byte, other text by Unicode's rules",
        arguments: [
            ("Content-Type", "content-type"), ("etag", "etag"), ("X-AMZ-Request-ID", "x-amz-request-id"), ("", ""),
            ("ÉCOLE.example", "école.example"), ("Upload-Offset: 5", "upload-offset: 5"),
        ])
    func asciiLowercased(text: String, lower: String) {
        #expect(text.asciiLowercased == lower)
    }

    @Test("RFC 3339 round trip and offsets")
    func times() {
        #expect(RFC3339.format(0) == "1970-01-01T00:00:00.000Z")
        // Found by the fuzz target `row`: a stored time no year of four digits holds trapped in
        // the conversion to time_t (or in a digit below zero) when the task was shown.
        #expect(RFC3339.format(1.8e91) == "9999-12-31T23:59:59.999Z")
        #expect(RFC3339.format(.infinity) == "9999-12-31T23:59:59.999Z")
        #expect(RFC3339.format(253_402_300_799.9999) == "9999-12-31T23:59:59.999Z")
        #expect(RFC3339.format(-1e15) == "0000-01-01T00:00:00.000Z")
        #expect(RFC3339.format(-.infinity) == "0000-01-01T00:00:00.000Z")
        #expect(RFC3339.format(.nan) == "1970-01-01T00:00:00.000Z")
        #expect(RFC3339.parse("2026-11-22T02:00:00Z") == 1_795_312_800)
        #expect(RFC3339.parse("2026-11-22T03:00:00+01:00") == 1_795_312_800)
        #expect(RFC3339.parse("2026-11-22T02:00:00.250Z") == 1_795_312_800.25)
        #expect(RFC3339.parse(RFC3339.format(1_795_312_800.5)) == 1_795_312_800.5)
        // Written into JSON in place: the same text, quoted; null when there is no time.
        var writer = JSONWriter(capacity: 8)
        writer.array { array in
            array.timestamp(1_795_312_800.9996)
            array.timestamp(nil)
        }
        #expect(writer.text == #"["2026-11-22T02:00:01.000Z",null]"#)
        for bad in ["2026-11-22", "2026-13-01T00:00:00Z", "2026-11-22T02:00:00", "yesterday", "2026-11-22T02:00:00Zjunk"] {
            #expect(RFC3339.parse(bad) == nil, "\(bad)")
        }
    }

    @Test("base64 round trip")
    func base64() {
        for count in 0..<20 {
            let bytes = (0..<count).map { UInt8(($0 * 37 + 11) & 0xFF) }
            #expect(Base64.decode(Base64.encode(bytes)) == bytes)
        }
        #expect(Base64.encode(Array("hello".utf8)) == "aGVsbG8=")
    }

    /// Only canonical padded base64 decodes (RFC 4648 §3.5, §4): the old decoder dropped `=`
    /// anywhere and checked no length, so all of these gave bytes.
    @Test(
        "base64 refuses what is not canonical",
        arguments: [
            "aGVsbG8", "aGVs=bG8=", "aGVsbG8==", "aGVsbG9=", "a===", "====", "aGVsbG8=\n", " aGVsbG8=", "aGVs*G8=", "aGVsbA=x",
            "aGVsbG-=", "aGVsbG_=",
        ])
    func base64Refuses(_ text: String) {
        #expect(Base64.decode(text) == nil, "\(text)")
    }

    @Test("base64 decodes the canonical forms")
    func base64Canonical() {
        #expect(Base64.decode("") == [])
        #expect(Base64.decode("aGVsbG8=") == Array("hello".utf8))
        #expect(Base64.decode("aGVsbA==") == Array("hell".utf8))
        #expect(Base64.decode("aGVs") == Array("hel".utf8))
        #expect(Base64.decode("+/+/") == [0xFB, 0xFF, 0xBF])
    }
}

@Suite("Upload state machines")
struct UploadMachineTests {
    func task(_ upload: UploadSpec = UploadSpec()) -> TaskRecord {
        TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/d/clip.mp4", size: 1000, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: "http://h/x", method: "PUT"), upload: upload, createdAt: 0, deadlineAt: 100)
    }

    @Test("raw: one request with the whole file; 2xx completes")
    func raw() {
        var machine = SingleRequestUpload(task: task(), headers: [("A", "1")])
        #expect(
            machine.start(now: 0)
                == .send(
                    PlannedRequest(
                        method: "PUT", url: "http://h/x", headers: [("A", "1")],
                        body: .file(offset: 0, length: 1000))))
        #expect(machine.bytesAcknowledged == 0)
        #expect(machine.didReceive(ResponseHead(status: 204), now: 1) == .completed)
        #expect(machine.bytesAcknowledged == 1000)
    }

    @Test("raw: a failure hands the status and Retry-After to the retry policy")
    func rawFailure() {
        var machine = SingleRequestUpload(task: task(), headers: [])
        _ = machine.start(now: 0)
        #expect(
            machine.didReceive(ResponseHead(status: 503, headers: ["retry-after": "7"]), now: 0)
                == .failed(.http(status: 503, retryAfter: 7)))
        #expect(machine.bytesAcknowledged == 0)
        // The next attempt starts over.
        guard case .send = machine.start(now: 1) else {
            Issue.record("expected a request")
            return
        }
    }

    @Test("multipart: the plan names field, filename and type, defaulting to the file's name")
    func multipart() {
        var spec = UploadSpec(protocolName: .multipart)
        spec.fields = [("device", "cam")]
        var machine = SingleRequestUpload(task: task(spec), headers: [])
        guard case .send(let request) = machine.start(now: 0), case .multipart(let plan) = request.body else {
            Issue.record("expected a multipart request")
            return
        }
        #expect(plan.fileField == "file")
        #expect(plan.filename == "clip.mp4")
        #expect(plan.contentType == "application/octet-stream")
        #expect(plan.fields == [FormField(name: "device", value: "cam")])
    }
}
