import BackhaulTesting
import Foundation
import JSONCodec
import Testing

/// docs/credentials.md: credentials that expire, and where a task's requests may go.
extension EndToEndTests {
    /// A tus upload of `file` created at the fixture's sink, with a bearer token to follow.
    private func enqueueTus(_ fixture: Fixture, _ file: String) throws -> String {
        try fixture.enqueue(
            file,
            extra: [
                "request": [
                    "url": .string(fixture.sink.url("/files/")), "method": "POST",
                    "headers": ["Authorization": "Bearer tus-secret"],
                ],
                "upload": ["protocol": "tus"],
            ])
    }

    /// A sink on 127.0.0.2: another host to an allow-list that admits 127.0.0.1 only.
    func otherHostSink(_ fixture: Fixture) throws -> RecordingSink {
        try RecordingSink(directory: fixture.scratch.file("other-host"), host: "127.0.0.2")
    }

    @Test("tus: a creation whose Location names a host outside the allow-list fails the task; nothing goes there")
    func tusLocationOutsideAllowList() throws {
        let fixture = try Fixture(daemonArguments: ["--allow-upload-host", "127.0.0.1"])
        let other = try otherHostSink(fixture)
        try fixture.session()
        fixture.sink.enqueue(
            .respond(
                status: 201,
                headers: [("Location", other.url("/files/1")), ("Tus-Resumable", "1.0.0"), ("Upload-Offset", "0")]))
        let file = fixture.makeFile("a.bin", size: 256 * 1024)
        let id = try enqueueTus(fixture, file)
        let task = try fixture.daemon.waitForTask(id)
        fixture.expectLog(task["state"]?.stringValue == "failed", task.serialized())
        #expect(task["error"]?["code"]?.intValue == -1011)
        #expect(task["error"]?["reason"]?.stringValue == "location_host_not_allowed")
        #expect(fixture.sink.requests.map(\.method) == ["POST"])
        // A cancel of a failed task sends no termination either.
        _ = try fixture.daemon.call("POST", "/v1/tasks/\(id)/cancel")
        Thread.sleep(forTimeInterval: 1)
        #expect(other.requests.isEmpty, "\(other.requests.map { "\($0.method) \($0.path)" })")
    }

    @Test("ietf: a 104 whose Location names a host outside the allow-list fails the task; nothing goes there")
    func ietfLocationOutsideAllowList() throws {
        let fixture = try Fixture(daemonArguments: ["--allow-upload-host", "127.0.0.1"])
        let other = try otherHostSink(fixture)
        let server = try IETFServer(directory: fixture.scratch.path, origin: "http://127.0.0.2:\(other.port)")
        try fixture.session()
        let file = fixture.makeFile("a.bin", size: 8 * 1024 * 1024)
        let id = try enqueueIETF(fixture, url: server.url("/upload"), file: file)
        let task = try fixture.daemon.waitForTask(id)
        fixture.expectLog(
            task["state"]?.stringValue == "failed", "\(task.serialized()) \(server.requests.map { $0.serialized() })")
        #expect(task["error"]?["code"]?.intValue == -1011)
        #expect(task["error"]?["reason"]?.stringValue == "location_host_not_allowed")
        // The peer writes its log line when the request ends, which may come after the daemon
        // gave up on the 104 (seen once under load).
        #expect(
            eventually(timeout: 5) {
                server.requests.contains { $0["location"]?.stringValue?.contains("127.0.0.2") == true }
            })
        #expect(other.requests.isEmpty, "\(other.requests.map { "\($0.method) \($0.path)" })")
    }

    @Test("a Location on a host the allow-list admits is followed, headers and all")
    func tusLocationInsideAllowList() throws {
        let fixture = try Fixture(daemonArguments: ["--allow-upload-host", "127.0.0.1", "--allow-upload-host", "127.0.0.2"])
        let other = try otherHostSink(fixture)
        try fixture.session()
        fixture.sink.enqueue(
            .respond(
                status: 201,
                headers: [("Location", other.url("/files/1")), ("Tus-Resumable", "1.0.0"), ("Upload-Offset", "0")]))
        let size = 256 * 1024
        other.setFallback(.respond(status: 204, headers: [("Tus-Resumable", "1.0.0"), ("Upload-Offset", String(size))]))
        let file = fixture.makeFile("a.bin", size: size)
        let id = try enqueueTus(fixture, file)
        let task = try fixture.daemon.waitForTask(id)
        fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
        #expect(other.requests.map(\.method) == ["PATCH"])
        #expect(other.requests.first?.headers["authorization"] == "Bearer tus-secret")
    }

    @Test("a redirect is an answer, not followed: the task's body and headers stay at its own origin")
    func redirectNotFollowed() throws {
        let fixture = try Fixture()
        let other = try otherHostSink(fixture)
        try fixture.session()
        fixture.sink.setFallback(.respond(status: 307, headers: [("Location", other.url("/moved"))]))
        let file = fixture.makeFile("a.bin", size: 64 * 1024)
        let task = try fixture.daemon.waitForTask(try fixture.enqueue(file))
        fixture.expectLog(task["state"]?.stringValue == "failed", task.serialized())
        #expect(task["error"]?["http_status"]?.intValue == 307)
        #expect(other.requests.isEmpty)
    }
}

extension EndToEndTests {
    static let expiredBody =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code><Message>Request has expired</Message>"
        + "<Expires>2026-11-27T08:00:00Z</Expires><ServerTime>2026-11-27T09:00:00Z</ServerTime></Error>"

    @Test("a 403 'Request has expired' holds the task in auth_required with credentials_expired")
    func expiredURLWantsNewCredentials() throws {
        let fixture = try Fixture()
        try fixture.session()
        fixture.sink.enqueue(.respond(status: 403, headers: [("Content-Type", "application/xml")], body: Self.expiredBody))
        let id = try fixture.enqueue(fixture.makeFile("a.bin", size: 1000), path: "/old?X-Amz-Expires=60")
        let held = try fixture.daemon.waitForTask(id, state: "auth_required")
        fixture.expectLog(held["state"]?.stringValue == "auth_required", held.serialized())
        #expect(held["auth"]?["reason"]?.stringValue == "credentials_expired")
        #expect(held["last_error"]?["reason"]?.stringValue == "credentials_expired")
        #expect(held["last_error"]?["http_status"]?.intValue == 403)
        let events = try fixture.daemon.call("GET", "/v1/tasks/\(id)/attempts").1
        #expect(events.serialized().contains("credentials_expired"))
    }
}

extension EndToEndTests {
    @Test("after an expired URL, a PATCH of request.url lets the task complete there; the old URL gets nothing more")
    func newURLForAWaitingTask() throws {
        let fixture = try Fixture()
        try fixture.session()
        fixture.sink.enqueue(.respond(status: 403, headers: [("Content-Type", "application/xml")], body: Self.expiredBody))
        let file = fixture.makeFile("a.bin", size: 300 * 1024)
        let id = try fixture.enqueue(file, path: "/old?X-Amz-Signature=aaaa")
        _ = try fixture.daemon.waitForTask(id, state: "auth_required")
        // Refused: a URL that is not http(s), and a method a download would use.
        #expect(try fixture.daemon.call("PATCH", "/v1/tasks/\(id)", ["request": ["url": "ftp://x/y"]]).0 == 422)
        #expect(try fixture.daemon.call("PATCH", "/v1/tasks/\(id)", ["request": ["method": "GET"]]).0 == 422)
        let (status, patched) = try fixture.daemon.call(
            "PATCH", "/v1/tasks/\(id)",
            ["request": ["url": .string(fixture.sink.url("/new?X-Amz-Signature=bbbb")), "method": "POST"]])
        #expect(status == 200, "\(patched.serialized())")
        let task = try fixture.daemon.waitForTask(id)
        fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
        #expect(task["request"]?["url"]?.stringValue == fixture.sink.url("/new?X-Amz-Signature=bbbb"))
        let requests = fixture.sink.requests
        #expect(requests.map(\.path) == ["/old", "/new"])
        #expect(requests.last?.method == "POST")
        #expect(Bytes(requests.last?.body ?? Data()) == Bytes(fixture.contents(file)))
    }

    @Test("a running task's URL cannot change; outside the allow-list is refused like at enqueue")
    func newURLRefused() throws {
        let fixture = try Fixture(daemonArguments: ["--allow-upload-host", "127.0.0.1"])
        try fixture.session()
        fixture.sink.setFallback(.stall(seconds: 3, status: 201))
        let id = try fixture.enqueue(fixture.makeFile("a.bin", size: 1000))
        _ = try fixture.daemon.waitForTask(id, state: "running")
        let (running, problem) = try fixture.daemon.call(
            "PATCH", "/v1/tasks/\(id)", ["request": ["url": .string(fixture.sink.url("/b"))]])
        #expect(running == 409, "\(problem.serialized())")
        _ = try fixture.daemon.call("POST", "/v1/tasks/\(id)/suspend")
        let (outside, refusal) = try fixture.daemon.call("PATCH", "/v1/tasks/\(id)", ["request": ["url": "http://127.0.0.2:9/x"]])
        #expect(outside == 403, "\(refusal.serialized())")
        #expect(refusal["code"]?.stringValue == "destination_not_allowed")
    }

    @Test("tus: a new URL for a suspended upload creates a new upload there; the old one is terminated, nothing else")
    func tusNewURL() throws {
        let fixture = try Fixture()
        let old = try TusServer(directory: fixture.scratch.file("old"))
        let new = try TusServer(directory: fixture.scratch.file("new"))
        try fixture.session()
        let file = fixture.makeFile("big.mp4", size: 24 * 1024 * 1024)
        let id = try enqueueTus(fixture, old, file: file, chunk: 1 << 20)
        try #require(eventually(timeout: 30) { old.requests.filter { $0["method"]?.stringValue == "PATCH" }.count >= 2 })
        _ = try fixture.daemon.call("POST", "/v1/tasks/\(id)/suspend")
        _ = try fixture.daemon.waitForTask(id, state: "suspended")
        let (status, body) = try fixture.daemon.call(
            "PATCH", "/v1/tasks/\(id)", ["request": ["url": .string(new.creationURL)]])
        #expect(status == 200, "\(body.serialized())")
        #expect(body["bytes_sent"]?.intValue == 0 || body["progress"]?["bytes_sent"]?.intValue == 0)
        let deleted = eventually(timeout: 15) { old.requests.contains { $0["method"]?.stringValue == "DELETE" } }
        fixture.expectLog(deleted, "old: \(old.requests.map { $0.serialized() })")
        let oldCount = old.requests.count
        _ = try fixture.daemon.call("POST", "/v1/tasks/\(id)/resume")
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
        #expect(Bytes(fixture.contents(new.uploads.first ?? "")) == Bytes(fixture.contents(file)))
        #expect(new.requests.first?["method"]?.stringValue == "POST")
        #expect(old.requests.count == oldCount, "the old server got nothing after its DELETE")
        #expect(old.uploads.isEmpty)
    }
}

/// `s3` tasks that give a region only: the daemon's AWS credential chain (docs/credentials.md) against moto
/// checking SigV4, with temporary credentials from moto's STS.
extension EndToEndTests {
    /// Every place a secret could leak to: the task as GET shows it, its attempts, the daemon's
    /// log, the webhook deliveries (their bodies), and the state directory (with its events) once
    /// the task ended.
    func expectNowhere(_ secrets: [String], _ fixture: Fixture, task id: String, webhooks: WebhookReceiver? = nil) throws {
        let shown = try fixture.daemon.call("GET", "/v1/tasks/\(id)").1.serialized()
        let events = try fixture.daemon.call("GET", "/v1/tasks/\(id)/attempts").1.serialized()
        let log = fixture.daemon.log(lastLines: 100_000)
        var state = Data()
        for name in (try? FileManager.default.contentsOfDirectory(atPath: fixture.scratch.file("state"))) ?? [] {
            state += FileManager.default.contents(atPath: fixture.scratch.file("state/\(name)")) ?? Data()
        }
        let stateText = String(decoding: state, as: UTF8.self)
        if let webhooks {
            let delivered = eventually(timeout: 15) { webhooks.accepted.contains { $0["task_id"]?.stringValue == id } }
            #expect(delivered, "the task's webhook came")
        }
        let deliveries =
            webhooks.map { String(decoding: FileManager.default.contents(atPath: $0.logFile) ?? Data(), as: UTF8.self) } ?? ""
        #expect(webhooks == nil || deliveries.contains(id))
        for secret in secrets where !secret.isEmpty {
            #expect(!deliveries.contains(secret), "a secret in a webhook")
            #expect(!shown.contains(secret) && !events.contains(secret), "a secret in GET")
            #expect(!log.contains(secret), "a secret in the log")
            #expect(!stateText.contains(secret), "a secret in the state")
        }
    }

    func enqueueS3FromChain(_ fixture: Fixture, url: String, file: String) throws -> String {
        try fixture.enqueue(
            file,
            extra: [
                "request": ["url": .string(url), "method": "PUT"],
                "upload": ["protocol": "s3", "chunk_size": .int(8 << 20)], "s3": ["region": "us-east-1"],
            ])
    }

    /// No source but the one a test names: the machine's own files and variables stay out.
    func chainEnvironment(_ scratch: TemporaryDirectory, _ variables: [String: String]) -> [String: String] {
        [
            "AWS_SHARED_CREDENTIALS_FILE": scratch.file("no-credentials"), "AWS_CONFIG_FILE": scratch.file("no-config"),
            "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_CONTAINER_CREDENTIALS_FULL_URI": "",
            "AWS_WEB_IDENTITY_TOKEN_FILE": "", "AWS_ROLE_ARN": "", "AWS_EC2_METADATA_SERVICE_ENDPOINT": "",
        ].merging(variables) { $1 }
    }

    /// The secrets a credentials helper handed out (its log).
    func handedOut(_ log: String) -> [String] {
        PythonPeer.lines(log).flatMap { [$0["secret"]?.stringValue ?? "", $0["token"]?.stringValue ?? ""] }
    }

    @Test("s3 from the chain: a credential_process profile gives STS keys; signed with the session token")
    func s3CredentialProcess() throws {
        let scratch = TemporaryDirectory("backhaul-aws")
        let s3 = try S3Server(directory: scratch.path)
        let config = scratch.file("config")
        let issued = scratch.file("issued.jsonl")
        let helper = PythonPeer.script("aws_credentials.py")
        try "[profile edge]\ncredential_process = python3 \(helper) --process --s3 \(s3.credentialsFile) --log \(issued)\n".write(
            toFile: config, atomically: true, encoding: .utf8)
        let fixture = try Fixture(
            daemonArguments: fastWebhookRetries,
            environment: chainEnvironment(scratch, ["AWS_CONFIG_FILE": config, "AWS_PROFILE": "edge"]))
        try fixture.session()
        let webhooks = try WebhookReceiver(directory: scratch.path, secrets: [WebhookRecordSecret.fixed])
        try fixture.subscribe(webhooks.url, secret: WebhookRecordSecret.fixed)
        let file = fixture.makeFile("big.bin", size: 12 * 1024 * 1024 + 3)
        let id = try enqueueS3FromChain(fixture, url: s3.objectURL("edge/big.bin"), file: file)
        let task = try fixture.daemon.waitForTask(id, timeout: 90)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized()) \(s3.requests.suffix(5))")
        #expect(Bytes(s3.object("edge/big.bin")) == Bytes(fixture.contents(file)))
        let secrets = handedOut(issued)
        #expect(secrets.count >= 2)
        try expectNowhere(secrets, fixture, task: id, webhooks: webhooks)
    }

    @Test("s3 from the chain: a container endpoint rotating STS keys every 10 s; 40 MiB at 3 MiB/s spans the renewals")
    func s3ContainerCredentialsRotate() throws {
        let scratch = TemporaryDirectory("backhaul-aws")
        let s3 = try S3Server(directory: scratch.path)
        let proxy = try ThrottleProxy(target: s3.peer.port, rate: 3 << 20)
        let fetches = scratch.file("fetches.jsonl")
        let token = "container-token-\(UInt32.random(in: 0...UInt32.max))"
        let endpoint = try PythonPeer(
            script: "aws_credentials.py",
            arguments: ["--s3", s3.credentialsFile, "--token", token, "--log", fetches, "--rotate", "10"])
        let tokenFile = scratch.file("token")
        try token.write(toFile: tokenFile, atomically: true, encoding: .utf8)
        let fixture = try Fixture(
            environment: chainEnvironment(
                scratch,
                [
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://127.0.0.1:\(endpoint.port)/creds",
                    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": tokenFile,
                ]))
        try fixture.session()
        let file = fixture.makeFile("big.bin", size: 40 * 1024 * 1024)
        let started = Date()
        let url = "http://127.0.0.1:\(proxy.port)/\(s3.bucket)/rotating/big.bin"
        let id = try enqueueS3FromChain(fixture, url: url, file: file)
        let task = try fixture.daemon.waitForTask(id, timeout: 120)
        let seconds = Date().timeIntervalSince(started)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(Bytes(s3.object("rotating/big.bin")) == Bytes(fixture.contents(file)))
        let keys = PythonPeer.lines(fetches).compactMap { $0["access_key_id"]?.stringValue }
        print("container credentials: \(keys.count) fetches, \(Set(keys).count) key sets over \(Int(seconds)) s")
        #expect(Set(keys).count >= 2, "the upload spanned at least one rotation: \(keys)")
        #expect(seconds > 10)
        try expectNowhere([token] + handedOut(fetches), fixture, task: id)
    }
}

extension EndToEndTests {
    @Test(
        "s3 from the chain: no source yet holds the task waiting for aws_credentials; once a credentials file appears it completes"
    )
    func s3ChainWithoutSourceRetries() throws {
        let scratch = TemporaryDirectory("backhaul-aws")
        let s3 = try S3Server(directory: scratch.path)
        let credentials = scratch.file("credentials")
        let fixture = try Fixture(environment: chainEnvironment(scratch, ["AWS_SHARED_CREDENTIALS_FILE": credentials]))
        try fixture.session("s1", quickRetry)
        let file = fixture.makeFile("small.bin", size: 100_000)
        let id = try enqueueS3FromChain(fixture, url: s3.objectURL("later/small.bin"), file: file)
        let waiting = eventually(timeout: 20) {
            (try? fixture.daemon.task(id))?["waiting_reason"]?.stringValue == "aws_credentials"
                && fixture.daemon.log().contains("no AWS credentials")
        }
        let seen = try fixture.daemon.task(id)
        fixture.expectLog(waiting && seen["state"]?.stringValue == "waiting", seen.serialized())
        let key = s3.credentials["access_key_id"]?.stringValue ?? ""
        let secret = s3.credentials["secret_access_key"]?.stringValue ?? ""
        try "[default]\naws_access_key_id = \(key)\naws_secret_access_key = \(secret)\n".write(
            toFile: credentials, atomically: true, encoding: .utf8)
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
        #expect(Bytes(s3.object("later/small.bin")) == Bytes(fixture.contents(file)))
        try expectNowhere([secret], fixture, task: id)
    }
}

extension EndToEndTests {
    @Test("s3 from the chain: an ExpiredToken is retried with the chain asked again, not auth_required")
    func s3ChainExpiredTokenRetries() throws {
        let scratch = TemporaryDirectory("backhaul-aws")
        let fixture = try Fixture(
            environment: chainEnvironment(scratch, ["AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "env-secret"]))
        try fixture.session("s1", quickRetry)
        let body =
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>ExpiredToken</Code>"
            + "<Message>The provided token has expired.</Message></Error>"
        fixture.sink.enqueue(.respond(status: 400, headers: [("Content-Type", "application/xml")], body: body))
        fixture.sink.setFallback(.respond(status: 200, headers: [("ETag", "\"e\"")]))
        let id = try enqueueS3FromChain(
            fixture, url: fixture.sink.url("/bucket/key"), file: fixture.makeFile("a.bin", size: 1000))
        let task = try fixture.daemon.waitForTask(id)
        fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
        #expect(fixture.sink.requests.count == 2)
        #expect(fixture.sink.requests.allSatisfy { $0.headers["authorization"]?.contains("Credential=AKIAEXAMPLE/") == true })
        let attempts = try fixture.daemon.call("GET", "/v1/tasks/\(id)/attempts").1["attempts"]?.arrayValue ?? []
        let retried = attempts.first { $0["outcome"]?.stringValue == "retry" }
        #expect(retried?["error"]?["code"]?.intValue == -1013, "an expiry, not a network failure: \(attempts)")
        #expect(retried?["error"]?["reason"]?.stringValue == "credentials_expired")
        #expect(retried?["error"]?["http_status"]?.intValue == 400)
        try expectNowhere(["env-secret"], fixture, task: id)
    }
}
