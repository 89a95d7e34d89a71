import BackhaulCore
import Digest
import JSONCodec
import Testing

@Suite("A session's signer: its configuration, the steps, the answers")
struct SignerTests {
    static let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

    @Test("configuration.signer: url and secret stored, the url only shown; null removes it; bad values refused")
    func configuration() throws {
        let set = try TransferConfiguration().applying([
            "signer": ["url": "http://127.0.0.1:9/sign", "secret": .string(Self.secret)]
        ])
        #expect(set.signer == SignerConfiguration(url: "http://127.0.0.1:9/sign", secret: Self.secret))
        #expect(set.json(redacted: true)["signer"] == ["url": "http://127.0.0.1:9/sign"])
        #expect(set.json["signer"]?["secret"]?.stringValue == Self.secret)
        #expect(try TransferConfiguration().applying(set.json) == set, "the stored form reads back")
        #expect(try set.applying(["retry": ["max_attempts": 3]]).signer == set.signer, "a patch without signer keeps it")
        #expect(try set.applying(["signer": .null]).signer == nil)
        for bad: JSON in [
            ["url": "ftp://h/x", "secret": .string(Self.secret)], ["url": "http://h/x", "secret": "plain"],
            ["url": "http://h/x"], ["url": "http://h/x", "secret": .string(Self.secret), "extra": 1],
        ] {
            #expect(throws: ValidationError.self) { try TransferConfiguration().applying(["signer": bad]) }
        }
    }

    @Test("a signer keeps a configuration within 128 bytes, which the engine copies without memcpy")
    func configurationSize() {
        // Past 128 bytes every copy of a configuration (several a task) became a call to memcpy:
        // BENCHMARKS.md's instructions per task.
        #expect(MemoryLayout<TransferConfiguration>.size <= 128)
        let one = SignerConfiguration(url: "http://127.0.0.1:9/sign", secret: Self.secret)
        #expect(one == SignerConfiguration(url: "http://127.0.0.1:9/sign", secret: Self.secret), "equal by value")
        #expect(one != SignerConfiguration(url: "http://127.0.0.1:9/other", secret: Self.secret))
    }

    @Test("a task's configuration may not name a signer")
    func notForTasks() {
        let body: JSON = [
            "file": "/data/a", "request": ["url": "http://h/u"], "configuration": ["signer": ["url": "http://h/s"]],
        ]
        #expect(throws: ValidationError.self) { try TaskDraft.decode(body, base: TransferConfiguration()) }
    }

    @Test("steps: raw, s3's create/part/complete/list/abort, tus, chunked, cleanups")
    func steps() {
        func target(
            _ method: String, _ url: String, _ protocolName: UploadProtocol, headers: [(String, String)] = [],
            cleanup: Bool = false
        )
            -> SignTarget
        {
            SignTarget.of(
                PlannedRequest(method: method, url: url, headers: headers, body: .empty), kind: .upload,
                protocolName: protocolName,
                cleanup: cleanup)
        }
        let object = "http://h/b/k.bin"
        #expect(target("PUT", object, .raw) == SignTarget(step: .request))
        #expect(target("POST", object + "?uploads", .s3) == SignTarget(step: .create))
        #expect(
            target("PUT", object + "?partNumber=3&uploadId=a%2Bb", .s3) == SignTarget(step: .part, partNumber: 3, uploadID: "a+b")
        )
        #expect(target("POST", object + "?uploadId=u1", .s3) == SignTarget(step: .complete, uploadID: "u1"))
        #expect(target("GET", object + "?uploadId=u1", .s3) == SignTarget(step: .resume, uploadID: "u1"))
        #expect(target("DELETE", object + "?uploadId=u1", .s3, cleanup: true) == SignTarget(step: .abort, uploadID: "u1"))
        #expect(target("POST", "http://h/files", .tus) == SignTarget(step: .create))
        #expect(target("PATCH", "http://h/files/1", .tus) == SignTarget(step: .resume))
        #expect(target("HEAD", "http://h/files/1", .ietf) == SignTarget(step: .resume))
        #expect(target("PUT", object, .chunked, headers: [("Content-Range", "bytes 0-99/1000")]) == SignTarget(step: .create))
        #expect(target("PUT", object, .chunked, headers: [("Content-Range", "bytes 100-199/1000")]) == SignTarget(step: .resume))
        #expect(target("PUT", object, .chunked, headers: [("Content-Range", "bytes */1000")]) == SignTarget(step: .resume))
    }

    @Test(
        "answers: 200 with a url signs; no answer, 5xx, 408, 429, not JSON are transient; 4xx refuses; JSON without a url is invalid"
    )
    func answers() throws {
        let good = try JSON.parse(
            #"{"url": "http://h/u?t=1", "method": "post", "headers": {"X-T": "v"}, "expires_at": "2030-01-01T00:00:00Z"}"#)
        guard case .signed(let signature) = SignerOutcome.decide(status: 200, json: good) else {
            Issue.record("not signed")
            return
        }
        #expect(signature.url == "http://h/u?t=1" && signature.method == "POST" && signature.headers.first?.1 == "v")
        #expect(signature.expiresAt == RFC3339.parse("2030-01-01T00:00:00Z"))
        for (status, json) in [
            (0, nil), (503, nil), (500, nil), (408, nil), (429, nil), (200, nil as JSON?), (200, JSON.array([])),
        ] {
            guard case .transient = SignerOutcome.decide(status: status, json: json) else {
                Issue.record("\(status) \(String(describing: json)) should be transient")
                continue
            }
        }
        for status in [400, 401, 403, 404] {
            #expect(SignerOutcome.decide(status: status, json: nil).failure?.reason == .signerRefused)
            #expect(SignerOutcome.decide(status: status, json: nil).failure?.code == -1013)
        }
        for body in [
            #"{"expires_at": "2030-01-01T00:00:00Z"}"#, #"{"url": "/relative"}"#,
            #"{"url": "http://h/", "headers": {"Host": "x"}}"#,
            #"{"url": "http://h/", "expires_at": "tomorrow"}"#, #"{"url": "http://h/", "method": "GE T"}"#,
        ] {
            let outcome = SignerOutcome.decide(status: 200, json: try JSON.parse(body))
            #expect(outcome.failure?.reason == .signerInvalidAnswer && outcome.failure?.code == -1011, "\(body)")
        }
    }

    @Test("a signature serves while more than 60 s remain, never without expires_at; applied, it drops the daemon's SigV4")
    func signatureUse() {
        var signature = Signature(url: "http://h/u?sig=1", method: "PUT", headers: [("x-amz-acl", "private")], expiresAt: 1000)
        #expect(signature.usable(at: 939))
        #expect(!signature.usable(at: 940))
        signature.expiresAt = nil
        #expect(!signature.usable(at: 0))
        let planned = PlannedRequest(
            method: "POST", url: "http://h/u", headers: [("X-Amz-ACL", "public"), ("Content-Type", "a/b")], body: .empty,
            signing: .fromChain(region: "eu-west-1"))
        let signed = signature.applied(to: planned)
        #expect(signed.url == "http://h/u?sig=1" && signed.method == "PUT" && signed.signing == nil)
        #expect(signed.headers.map(\.1) == ["a/b", "private"])
    }

    @Test("the question: the task, the step, the part, the request with its secret headers redacted")
    func question() throws {
        var upload = UploadSpec()
        upload.protocolName = .s3
        upload.filename = "a.bin"
        var task = TaskRecord(
            id: "t_1", sessionID: "s1", file: FileInfo(path: "/data/a.bin", size: 42, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: "http://h/b/a.bin", method: "PUT", headers: []), upload: upload, createdAt: 0,
            deadlineAt: 100)
        task.description = "holiday"
        let request = PlannedRequest(
            method: "PUT", url: "http://h/b/a.bin?partNumber=2&uploadId=u9",
            headers: [("Authorization", "Bearer s3cret"), ("Content-Type", "a/b")], body: .empty)
        let target = SignTarget.of(request, kind: .upload, protocolName: .s3)
        let body = SignRequest.body(task: task, target: target, request: request)
        #expect(body["type"] == "sign" && body["step"] == "part" && body["part_number"] == 2 && body["upload_id"] == "u9")
        #expect(body["task"]?["id"] == "t_1" && body["task"]?["session"] == "s1" && body["task"]?["size"] == 42)
        #expect(body["task"]?["file"] == "/data/a.bin" && body["task"]?["metadata"]?["description"] == "holiday")
        #expect(body["request"]?["method"] == "PUT" && body["request"]?["url"] == .string(request.url))
        #expect(body["request"]?["headers"]?["Content-Type"] == "a/b")
        #expect(!body.serialized().contains("s3cret"), "the task's credentials stay with the daemon")
        let key = try #require(WebhookRecord.key(of: Self.secret))
        let signature = WebhookSigner.signature(key: key, id: "sign_1", timestamp: 5, body: body.serializedBytes())
        #expect(signature.hasPrefix("v1,") && signature.count == 47)
    }
}

extension SignerOutcome {
    fileprivate var failure: TaskError? {
        if case .failed(let error) = self { return error }
        return nil
    }
}

@Suite("What a server repeats of a request's credentials is redacted from the stored response")
struct ResponseRedactionTests {
    static let token = "Fq0Zx%2Fa9+b/secret=="
    static let planned = PlannedRequest(
        method: "PUT", url: "https://b.example/k?partNumber=1&uploadId=u-1", headers: [], body: .empty)
    static let signature = Signature(
        url: "https://b.example/k?partNumber=1&uploadId=u-1&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=3600"
            + "&X-Amz-Date=20261123T101010Z&X-Amz-SignedHeaders=host&sig=0123456789abcdef&tok=\(token)&short=abc",
        headers: [("X-Upload-Token", "header-secret-42"), ("X-Short", "yes")])

    @Test("the signer's query values in each form a server writes them, and its header values; not what the plan had")
    func secrets() {
        let found = ResponseRedaction.secrets(of: Self.signature, planned: Self.planned)
        #expect(found.contains("0123456789abcdef"))
        #expect(found.contains(Self.token), "as written")
        #expect(found.contains("Fq0Zx/a9+b/secret=="), "decoded")
        #expect(found.contains("Fq0Zx%2Fa9%2Bb%2Fsecret%3D%3D"), "as SigV4's canonical query encodes it")
        #expect(found.contains("header-secret-42"))
        for shown in ["u-1", "1", "AWS4-HMAC-SHA256", "3600", "20261123T101010Z", "host", "abc", "yes"] {
            #expect(!found.contains(shown), "\(shown) is not a secret")
        }
    }

    @Test("an S3 SignatureDoesNotMatch body and an echoing header keep their words, not the credentials")
    func redactsBodyAndHeaders() {
        let body = """
            <Error><Code>SignatureDoesNotMatch</Code><Message>does not match</Message>\
            <SignatureProvided>0123456789abcdef</SignatureProvided>\
            <CanonicalRequest>PUT\n/k\npartNumber=1&amp;tok=Fq0Zx%2Fa9%2Bb%2Fsecret%3D%3D&amp;uploadId=u-1</CanonicalRequest>\
            <CanonicalRequestBytes>50 55 54 0a</CanonicalRequestBytes><Echo>header-secret-42</Echo></Error>
            """
        let secrets = ResponseRedaction.secrets(of: Self.signature, planned: Self.planned)
        let shown = ResponseRedaction.redact(
            headers: [("X-Echo", "tok=\(Self.token)"), ("ETag", "\"e-1\"")], body: Array(body.utf8), secrets: secrets)
        let text = String(decoding: shown.body, as: UTF8.self)
        #expect(text.contains("<Code>SignatureDoesNotMatch</Code><Message>does not match</Message>"))
        #expect(text.contains("<SignatureProvided>[redacted]</SignatureProvided>"))
        #expect(text.contains("&amp;tok=[redacted]&amp;uploadId=u-1"))
        #expect(text.contains("<CanonicalRequestBytes>[redacted]</CanonicalRequestBytes>"))
        #expect(text.contains("<Echo>[redacted]</Echo>"))
        #expect(shown.headers[0].1 == "tok=[redacted]")
        #expect(shown.headers[1].1 == "\"e-1\"")
    }

    @Test("X-Amz-Signature, -Security-Token and -Credential values are redacted in any body, signer or not")
    func awsParametersAlways() {
        let body = Array(
            "GET\n/k\nX-Amz-Credential=AKIA%2F2026%2Fus-east-1&amp;x-amz-security-token=IQoJb3JpZ2lu&X-Amz-Signature=ab12 rest"
                .utf8)
        let shown = ResponseRedaction.redact(headers: [], body: body, secrets: [])
        #expect(
            String(decoding: shown.body, as: UTF8.self)
                == "GET\n/k\nX-Amz-Credential=[redacted]&amp;x-amz-security-token=[redacted]&X-Amz-Signature=[redacted] rest")
        let plain = Array("{\"ok\": true}".utf8)
        let headers = [("Location", "https://h/k?X-Amz-Signature=ab12&x=1"), ("ETag", "\"e-1\"")]
        let untouched = ResponseRedaction.redact(headers: headers, body: plain, secrets: [])
        #expect(untouched.body == plain)
        #expect(untouched.headers.map(\.1) == ["https://h/k?X-Amz-Signature=[redacted]&x=1", "\"e-1\""])
    }
}
