import BackhaulCore
import BackhaulTesting
import Curl
import Foundation
import JSONCodec
import Testing

/// `signer.py`: a session's signer that hands out URLs whose HMAC token lasts seconds, and the
/// sink that accepts only valid, unexpired tokens (docs/credentials.md).
final class SignerPeer {
    let peer: PythonPeer
    let logFile: String
    let secretFile: String
    let modeFile: String
    let files: String

    /// `s3Errors`: the sink answers an expired token as S3 does (403 `AccessDenied`, "Request has
    /// expired"), not with a plain 403.
    init(
        directory: String, name: String = "signer", lifetime: Double = 3, s3Credentials: String? = nil,
        s3Errors: Bool = false
    ) throws {
        logFile = directory + "/\(name).jsonl"
        secretFile = directory + "/\(name).secret"
        modeFile = directory + "/\(name).mode"
        files = directory + "/\(name)-files"
        try FileManager.default.createDirectory(atPath: files, withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: logFile, contents: nil)
        peer = try PythonPeer(
            script: "signer.py",
            arguments: [
                "--secret-file", secretFile, "--log", logFile, "--mode-file", modeFile, "--lifetime", String(lifetime),
                "--files", files,
            ] + (s3Credentials.map { ["--s3", $0] } ?? []) + (s3Errors ? ["--s3-errors"] : []))
    }

    var signURL: String { "http://127.0.0.1:\(peer.port)/sign" }
    func sinkURL(_ name: String) -> String { "http://127.0.0.1:\(peer.port)/upload/\(name)" }
    /// Where the sink serves `files/<name>` to a GET with a valid token.
    func downloadURL(_ name: String) -> String { "http://127.0.0.1:\(peer.port)/download/\(name)" }
    var entries: [JSON] { PythonPeer.lines(logFile) }
    var questions: [JSON] { entries.filter { $0["sign"] != nil } }
    var uploads: [JSON] { entries.filter { $0["sink"] != nil } }
    /// The URL tokens and headers it handed out.
    var handedOut: [String] { questions.flatMap { [$0["token"]?.stringValue ?? "", $0["header"]?.stringValue ?? ""] } }

    func setMode(_ mode: String) throws { try mode.write(toFile: modeFile, atomically: true, encoding: .utf8) }

    /// Puts a session naming this signer and gives the signer the secret the daemon answered with.
    @discardableResult
    func session(_ fixture: Fixture, _ id: String, _ configuration: JSONObject = [:]) throws -> String {
        var object = configuration
        object["signer"] = ["url": .string(signURL)]
        let answer = try fixture.session(id, .object(object))
        let secret = try #require(answer["configuration"]?["signer"]?["secret"]?.stringValue)
        try secret.write(toFile: secretFile, atomically: true, encoding: .utf8)
        return secret
    }
}

extension EndToEndTests {
    @Test("signer: a task queued past the token's lifetime completes; the signer was asked after its begin time")
    func signerJustInTime() throws {
        let scratch = TemporaryDirectory("backhaul-signer")
        // Tokens last 5 s (4 to 5 as the sink rounds); the task may begin only 6 s after its enqueue.
        let signer = try SignerPeer(directory: scratch.path, lifetime: 5)
        let fixture = try Fixture(daemonArguments: ["--allow-upload-host", "127.0.0.1"] + fastWebhookRetries)
        let secret = try signer.session(fixture, "s1", quickRetry.objectValue ?? [:])
        #expect(secret.hasPrefix("whsec_"))
        let shown = try fixture.daemon.call("GET", "/v1/sessions/s1").1
        #expect(shown["configuration"]?["signer"]?["url"]?.stringValue == signer.signURL)
        #expect(!shown.serialized().contains(secret), "GET shows the signer's url, never its secret")
        let webhooks = try WebhookReceiver(directory: scratch.path, secrets: [WebhookRecordSecret.fixed])
        _ = try fixture.subscribe(webhooks.url, secret: WebhookRecordSecret.fixed)

        let file = fixture.makeFile("late.bin", size: 300_000)
        let begin = Date().timeIntervalSince1970 + 6
        let id = try fixture.enqueue(
            file,
            extra: [
                "request": ["url": .string(signer.sinkURL("late.bin")), "method": "PUT"],
                "earliest_begin_at": .string(RFC3339.format(begin)),
            ])
        let task = try fixture.daemon.waitForTask(id, timeout: 30)
        fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
        let question = try #require(signer.questions.first)
        #expect(question["verified"]?.boolValue == true, "the Standard Webhook signature checked out")
        #expect(question["step"]?.stringValue == "request")
        #expect(question["task"]?["id"]?.stringValue == id)
        #expect(question["task"]?["size"]?.intValue == 300_000)
        #expect(question["request"]?["method"]?.stringValue == "PUT")
        let asked = question["at"]?.doubleValue ?? 0
        #expect(asked >= begin - 0.01, "asked \(asked - begin) s after the task's begin time")
        let accepted = signer.uploads.filter { $0["accepted"]?.boolValue == true }
        #expect(accepted.count == 1)
        #expect(Bytes(fixture.contents(signer.files + "/late.bin")) == Bytes(fixture.contents(file)))

        let tokens = signer.handedOut.filter { !$0.isEmpty }
        #expect(tokens.count == 2)
        try expectNowhere(tokens, fixture, task: id, webhooks: webhooks)

        // The sink is not lenient: the URL and header handed out, once expired, are refused.
        let query = try #require(question["token"]?.stringValue)
        let header = try #require(question["header"]?.stringValue)
        let expires = Int(question["expires_at"]?.doubleValue ?? 0)
        while Date().timeIntervalSince1970 < Double(expires) + 1.1 { Thread.sleep(forTimeInterval: 0.1) }
        try fixture.session("plain", quickRetry)
        let stale = try fixture.enqueue(
            file, session: "plain",
            extra: [
                "request": [
                    "url": .string(signer.sinkURL("late.bin") + "?expires=\(expires)&token=\(query)"), "method": "PUT",
                    "headers": ["X-Upload-Token": .string(header)],
                ]
            ])
        let refused = try fixture.daemon.waitForTask(stale, timeout: 30)
        #expect(refused["state"]?.stringValue == "failed")
        #expect(signer.uploads.last?["reason"]?.stringValue == "expired")
    }

    @Test("signer: invalid JSON, no url, a URL outside the allow-list, a 30 s hang, 5xx, 4xx; none holds the others")
    func signerBadAnswers() throws {
        let scratch = TemporaryDirectory("backhaul-signer")
        let fixture = try Fixture(daemonArguments: ["--allow-upload-host", "127.0.0.1"])
        let retry: JSONObject = ["retry": ["initial_backoff": 0.05, "max_backoff": 0.2, "max_attempts": 2]]
        let modes = ["badjson", "nourl", "outside", "hang", "5xx", "4xx"]
        var signers: [String: SignerPeer] = [:]
        var ids: [String: String] = [:]
        for mode in modes {
            let signer = try SignerPeer(directory: scratch.path, name: mode)
            try signer.setMode(mode)
            try signer.session(fixture, mode, retry)
            signers[mode] = signer
        }
        let started = Date()
        for mode in modes {
            let file = fixture.makeFile("\(mode).bin", size: 50_000)
            ids[mode] = try fixture.enqueue(
                file, session: mode, extra: ["request": ["url": .string(signers[mode]!.sinkURL("\(mode).bin")), "method": "PUT"]])
        }
        // While the hanging signer holds its question, another session's task goes through.
        let good = try SignerPeer(directory: scratch.path, name: "good")
        try good.session(fixture, "good")
        let goodFile = fixture.makeFile("good.bin", size: 50_000)
        let goodID = try fixture.enqueue(
            goodFile, session: "good", extra: ["request": ["url": .string(good.sinkURL("good.bin")), "method": "PUT"]])
        let goodTask = try fixture.daemon.waitForTask(goodID, timeout: 8)
        fixture.expectLog(goodTask["state"]?.stringValue == "completed", goodTask.serialized())
        let goodSeconds = Date().timeIntervalSince(started)
        print("signer answers: another session's task completed \(String(format: "%.2f", goodSeconds)) s after the enqueues")
        #expect(goodSeconds < 8, "the hang held nothing")

        var tasks: [String: JSON] = [:]
        for mode in modes { tasks[mode] = try fixture.daemon.waitForTask(ids[mode]!, timeout: 40) }
        print("signer answers: all settled in \(String(format: "%.1f", Date().timeIntervalSince(started))) s")
        func error(_ mode: String) -> JSON { tasks[mode]?["error"] ?? .null }
        for mode in modes { #expect(tasks[mode]?["state"]?.stringValue == "failed", "\(mode): \(tasks[mode]!.serialized())") }
        // Transient: retried (two attempts), last_error saying what the signer did.
        for (mode, words) in [("badjson", "not a JSON object"), ("hang", "no answer within 10 s"), ("5xx", "HTTP 503")] {
            #expect(tasks[mode]?["attempts"]?.intValue == 2, "\(mode) retried")
            #expect(
                tasks[mode]?["last_error"]?["message"]?.stringValue?.contains(words) == true,
                "\(mode): \(tasks[mode]!.serialized())")
            #expect(signers[mode]!.questions.count == 2)
        }
        #expect(error("4xx")["code"]?.intValue == -1013)
        #expect(error("4xx")["reason"]?.stringValue == "signer_refused")
        #expect(error("nourl")["code"]?.intValue == -1011)
        #expect(error("nourl")["reason"]?.stringValue == "signer_invalid_answer")
        #expect(error("outside")["code"]?.intValue == -1011)
        #expect(error("outside")["reason"]?.stringValue == "location_host_not_allowed")
        for mode in ["4xx", "nourl", "outside"] { #expect(tasks[mode]?["attempts"]?.intValue == 1, "\(mode) not retried") }
        for mode in modes { #expect(signers[mode]!.uploads.isEmpty, "\(mode): nothing uploaded") }
        // Each answer counted once: badjson, hang and 5xx twice (transient), 4xx refused, nourl and
        // the URL outside the allow-list invalid, the other session's signature ok.
        let expected: [String: Double] = ["ok": 1, "transient": 6, "refused": 1, "invalid": 2]
        #expect(try signerRequests(fixture, expected: expected) == expected)
        #expect(!fixture.daemon.log(lastLines: 100_000).contains("token="), "no signed URL in the log")
    }
}

extension EndToEndTests {
    @Test("signer: an s3 task with no AWS keys on the machine is a presigned multipart upload; moto checks each URL")
    func signerPresignedMultipart() throws {
        let scratch = TemporaryDirectory("backhaul-signer")
        let s3 = try S3Server(directory: scratch.path)
        let signer = try SignerPeer(directory: scratch.path, lifetime: 30, s3Credentials: s3.credentialsFile)
        let fixture = try Fixture(
            daemonArguments: ["--allow-upload-host", "127.0.0.1"], environment: chainEnvironment(scratch, [:]))
        try signer.session(fixture, "s1", quickRetry.objectValue ?? [:])
        let file = fixture.makeFile("presigned.bin", size: 12 * 1024 * 1024 + 3)
        let id = try enqueueS3FromChain(fixture, url: s3.objectURL("signed/presigned.bin"), file: file)
        let task = try fixture.daemon.waitForTask(id, timeout: 90)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized()) \(s3.requests.suffix(5))")
        #expect(Bytes(s3.object("signed/presigned.bin")) == Bytes(fixture.contents(file)))
        let steps = signer.questions.map { $0["step"]?.stringValue ?? "" }
        #expect(steps == ["create", "part", "part", "complete"], "\(steps)")
        #expect(signer.questions.allSatisfy { $0["verified"]?.boolValue == true })
        let parts = signer.questions.filter { $0["step"]?.stringValue == "part" }
        #expect(parts.map { $0["part_number"]?.intValue ?? 0 } == [1, 2])
        #expect(parts.allSatisfy { $0["upload_id"]?.stringValue?.isEmpty == false })
        let presigned = s3.requests.filter { $0["presigned"]?.boolValue == true }
        #expect(presigned.count == 4 && presigned.allSatisfy { $0["refused"] == .null }, "\(presigned)")
        try expectNowhere(signer.handedOut, fixture, task: id)
    }
}

extension EndToEndTests {
    @Test("signer: a cancelled presigned multipart upload is aborted with a URL the signer presigned")
    func signerPresignedAbort() throws {
        let scratch = TemporaryDirectory("backhaul-signer")
        let s3 = try S3Server(directory: scratch.path)
        let proxy = try ThrottleProxy(target: s3.peer.port, rate: 1 << 20)
        let signer = try SignerPeer(directory: scratch.path, lifetime: 30, s3Credentials: s3.credentialsFile)
        let fixture = try Fixture(environment: chainEnvironment(scratch, [:]))
        try signer.session(fixture, "s1", quickRetry.objectValue ?? [:])
        let file = fixture.makeFile("cancelled.bin", size: 12 * 1024 * 1024)
        let url = "http://127.0.0.1:\(proxy.port)/\(s3.bucket)/signed/cancelled.bin"
        let id = try enqueueS3FromChain(fixture, url: url, file: file)
        let sending = eventually(timeout: 20) { signer.questions.contains { $0["step"]?.stringValue == "part" } }
        #expect(sending, "the first part is on its way")
        let (status, _) = try fixture.daemon.call("POST", "/v1/tasks/\(id)/cancel")
        #expect(status == 200 || status == 202)
        let aborted = eventually(timeout: 30) {
            s3.requests.contains { $0["presigned"]?.boolValue == true && $0["method"]?.stringValue == "DELETE" }
        }
        fixture.expectLog(aborted, "\(signer.questions.map { $0["step"]?.stringValue ?? "" }) \(s3.requests.suffix(4))")
        let abort = signer.questions.first { $0["step"]?.stringValue == "abort" }
        let created = signer.questions.first { $0["step"]?.stringValue == "part" }?["upload_id"]?.stringValue
        #expect(abort?["upload_id"]?.stringValue == created && created != nil)
        #expect(abort?["request"]?["method"]?.stringValue == "DELETE")
        let delete = s3.requests.last { $0["presigned"]?.boolValue == true && $0["method"]?.stringValue == "DELETE" }
        #expect(delete?["refused"] == .null, "moto's wrapper took the presigned DELETE")
    }
}

/// `backhaul_signer_requests_total` by outcome, read from `/metrics` with the Prometheus client's
/// parser once the engine has published `expected` (its figures reach the API every few hundred ms).
func signerRequests(_ fixture: Fixture, expected: [String: Double]) throws -> [String: Double] {
    var counts: [String: Double] = [:]
    _ = try eventually(timeout: 5) {
        let exchange = try HTTPClient().send("GET", fixture.daemon.url + "/metrics")
        let figures = try PrometheusParser.parse(String(decoding: exchange.body, as: UTF8.self))
        for outcome in ["ok", "transient", "refused", "invalid"] {
            counts[outcome] = figures["backhaul_signer_requests_total{outcome=\(outcome)}"]
        }
        return counts == expected
    }
    return counts
}

/// The task events of `id` in the event log, replayed by the SSE stream (curl reads it for two seconds).
func eventTypes(_ fixture: Fixture, task id: String) throws -> [String] {
    let curl = Process()
    curl.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
    curl.arguments = ["-sN", "-m", "2", fixture.daemon.url + "/v1/events?after=0"]
    let output = Pipe()
    curl.standardOutput = output
    try curl.run()
    let stream = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    curl.waitUntilExit()
    var types: [String] = []
    for line in stream.split(separator: "\n") where line.hasPrefix("data:") && line.contains(id) {
        guard let event = try? JSON.parse(Array(line.dropFirst(5).utf8)) else { continue }
        types.append(event["type"]?.stringValue ?? "")
    }
    return types
}

extension EndToEndTests {
    @Test("signer: a signed URL the server finds expired is signed again at once; the task never waits in auth_required")
    func signerExpiryRenewal() throws {
        let scratch = TemporaryDirectory("backhaul-signer")
        // The first answer's token is already past while its expires_at claims 120 s: the daemon keeps
        // and uses it, and the sink answers as S3 does, 403 AccessDenied "Request has expired".
        let signer = try SignerPeer(directory: scratch.path, lifetime: 120, s3Errors: true)
        try signer.setMode("expiredfirst")
        let fixture = try Fixture(daemonArguments: ["--allow-upload-host", "127.0.0.1"])
        try signer.session(fixture, "s1", quickRetry.objectValue ?? [:])
        let file = fixture.makeFile("renewed.bin", size: 200_000)
        let id = try fixture.enqueue(
            file, extra: ["request": ["url": .string(signer.sinkURL("renewed.bin")), "method": "PUT"]])
        let task = try fixture.daemon.waitForTask(id, timeout: 30)
        fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
        #expect(Bytes(fixture.contents(signer.files + "/renewed.bin")) == Bytes(fixture.contents(file)))

        let steps = signer.questions.map { $0["step"]?.stringValue ?? "" }
        #expect(steps == ["request", "request"], "asked once, then again after the expiry: \(steps)")
        #expect(signer.questions.first?["expired_token"]?.boolValue == true)
        let reasons = signer.uploads.map { $0["reason"]?.stringValue ?? "accepted" }
        #expect(reasons == ["expired", "accepted"], "\(reasons)")
        #expect(task["attempts"]?.intValue == 2)
        let attempts = try fixture.daemon.call("GET", "/v1/tasks/\(id)/attempts").1
        let first = attempts["attempts"]?.arrayValue?.first { $0["number"]?.intValue == 1 }
        #expect(first?["http_status"]?.intValue == 403, "\(attempts.serialized())")
        #expect(first?["error"]?["message"]?.stringValue?.contains("the signer is asked again") == true)
        #expect(first?["error"]?["code"]?.intValue == -1013, "an expiry, not a network failure: \(attempts.serialized())")
        #expect(first?["error"]?["reason"]?.stringValue == "credentials_expired")
        #expect(first?["error"]?["http_status"]?.intValue == 403)

        let types = try eventTypes(fixture, task: id)
        #expect(types.contains("task.completed"), "\(types)")
        #expect(!types.contains("task.auth_required"), "\(types)")
        let counts = try signerRequests(fixture, expected: ["ok": 2, "transient": 0, "refused": 0, "invalid": 0])
        #expect(counts == ["ok": 2, "transient": 0, "refused": 0, "invalid": 0])
        let metrics = try HTTPClient().send("GET", fixture.daemon.url + "/metrics")
        let figures = try PrometheusParser.parse(String(decoding: metrics.body, as: UTF8.self))
        #expect(figures["backhaul_retries_total{reason=credentials_expired}"] == 1)
        #expect(figures["backhaul_retries_total{reason=other}"] == 0)
        try expectNowhere(signer.handedOut, fixture, task: id)
    }

    @Test("signer: a download asks the signer (step request) and fetches from the signed URL, byte-exact")
    func signerDownload() throws {
        let scratch = TemporaryDirectory("backhaul-signer")
        let signer = try SignerPeer(directory: scratch.path, lifetime: 120)
        let source = signer.files + "/firmware.bin"
        try FileManager.default.copyItem(atPath: scratch.makeFile("firmware.bin", size: 3 << 20 | 7), toPath: source)
        let fixture = try Fixture(daemonArguments: ["--allow-upload-host", "127.0.0.1"])
        try signer.session(fixture, "s1", quickRetry.objectValue ?? [:])
        let id = try fixture.enqueueDownload(signer.downloadURL("firmware.bin"), to: "firmware.bin")
        let task = try fixture.daemon.waitForTask(id, timeout: 30)
        fixture.expectLog(task["state"]?.stringValue == "completed", task.serialized())
        #expect(Bytes(fixture.contents(fixture.data + "/firmware.bin")) == Bytes(fixture.contents(source)))

        let question = try #require(signer.questions.first)
        #expect(signer.questions.count == 1)
        #expect(question["verified"]?.boolValue == true)
        #expect(question["step"]?.stringValue == "request")
        #expect(question["request"]?["method"]?.stringValue == "GET")
        #expect(question["request"]?["url"]?.stringValue == signer.downloadURL("firmware.bin"))
        let gets = signer.uploads.filter { $0["method"]?.stringValue == "GET" }
        #expect(gets.count == 1 && gets.allSatisfy { $0["accepted"]?.boolValue == true }, "\(gets)")
        let counts = try signerRequests(fixture, expected: ["ok": 1, "transient": 0, "refused": 0, "invalid": 0])
        #expect(counts["ok"] == 1)
        try expectNowhere(signer.handedOut, fixture, task: id)

        // The sink is not lenient: the same URL without a token is refused.
        let unsigned = try HTTPClient().send("GET", signer.downloadURL("firmware.bin"))
        #expect(unsigned.status == 403)
    }

    @Test("signer: a server's SignatureDoesNotMatch repeating the token, query and header is stored with them redacted")
    func signerSecretsInErrorBody() throws {
        let scratch = TemporaryDirectory("backhaul-signer")
        let signer = try SignerPeer(directory: scratch.path, lifetime: 120)
        try signer.setMode("mismatch")
        let fixture = try Fixture(daemonArguments: ["--allow-upload-host", "127.0.0.1"])
        try signer.session(fixture, "s1", quickRetry.objectValue ?? [:])
        let file = fixture.makeFile("mismatch.bin", size: 10_000)
        let id = try fixture.enqueue(
            file, extra: ["request": ["url": .string(signer.sinkURL("mismatch.bin")), "method": "PUT"]])
        let task = try fixture.daemon.waitForTask(id, timeout: 30)
        #expect(task["state"]?.stringValue == "failed", "\(task.serialized())")
        #expect(task["error"]?["http_status"]?.intValue == 403)
        let response = task["response"] ?? .null
        let body = response["body"]?.stringValue ?? ""
        #expect(body.contains("<Code>SignatureDoesNotMatch</Code>"), "the rest of the body is kept: \(body)")
        #expect(body.contains("<SignatureProvided>[redacted]</SignatureProvided>"), "\(body)")
        #expect(body.contains("<CanonicalRequestBytes>[redacted]</CanonicalRequestBytes>"), "\(body)")
        #expect(body.contains("token=[redacted]"), "\(body)")
        #expect(response["headers"]?["X-Echo-Query"]?.stringValue?.contains("token=[redacted]") == true, "\(response)")
        let tokens = signer.handedOut.filter { !$0.isEmpty }
        #expect(tokens.count == 2)
        try expectNowhere(tokens, fixture, task: id)
    }
}
