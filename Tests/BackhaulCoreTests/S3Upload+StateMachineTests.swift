import Testing

@testable import BackhaulCore

@Suite("S3 multipart upload state machine")
struct S3UploadStateMachineTests {
    static let mib: Int64 = 1 << 20
    let credentials = S3Credentials(region: "eu-west-1", accessKeyID: "AKIA", secretAccessKey: "secret", sessionToken: "tok")

    func task(size: Int64, chunk: Int64? = nil) -> TaskRecord {
        var upload = UploadSpec(protocolName: .s3)
        upload.chunkSize = chunk
        upload.s3 = credentials
        return TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/d/f", size: size, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: "http://s3/b/k", method: "PUT"), upload: upload, createdAt: 0, deadlineAt: 100)
    }

    func xml(_ text: String) -> [UInt8] { Array(text.utf8) }

    @Test("part size: 8 MiB by default, 5 MiB at least")
    func partSizes() {
        #expect(S3Upload.partSize(nil) == 8 * Self.mib)
        #expect(S3Upload.partSize(Self.mib) == 5 * Self.mib)
        #expect(S3Upload.partSize(64 * Self.mib) == 64 * Self.mib)
    }

    @Test("a file of one part is one signed PUT with the session token and unsigned payload")
    func single() {
        var machine = S3Upload(task: task(size: 1000), headers: [], checkpoint: nil)
        guard case .send(let request) = machine.start(now: 0) else {
            Issue.record("expected a request")
            return
        }
        #expect(request.method == "PUT" && request.url == "http://s3/b/k" && request.body == .file(offset: 0, length: 1000))
        #expect(request.signing == credentials)
        #expect(request.headers.contains { $0 == ("x-amz-content-sha256", "UNSIGNED-PAYLOAD") })
        #expect(request.headers.contains { $0 == ("x-amz-security-token", "tok") })
        #expect(machine.didReceive(ResponseHead(status: 200), now: 0) == .completed)
    }

    @Test("create, parts with their ETags persisted, complete with the part list")
    func multipart() {
        var machine = S3Upload(task: task(size: 12 * Self.mib, chunk: 5 * Self.mib), headers: [], checkpoint: nil)
        guard case .send(let create) = machine.start(now: 0) else {
            Issue.record("expected a request")
            return
        }
        #expect(create.method == "POST" && create.url == "http://s3/b/k?uploads=")
        guard
            case .send(let part1) = machine.didReceive(
                ResponseHead(
                    status: 200,
                    body: xml("<InitiateMultipartUploadResult><UploadId>u+1</UploadId></InitiateMultipartUploadResult>")), now: 0)
        else {
            Issue.record("expected part 1")
            return
        }
        #expect(part1.url == "http://s3/b/k?partNumber=1&uploadId=u%2B1")
        #expect(part1.body == .file(offset: 0, length: 5 * Self.mib))
        guard case .send(let part2) = machine.didReceive(ResponseHead(status: 200, headers: ["etag": "\"e1\""]), now: 0) else {
            Issue.record("expected part 2")
            return
        }
        #expect(part2.url == "http://s3/b/k?partNumber=2&uploadId=u%2B1")
        #expect(machine.checkpoint == TransferCheckpoint(offset: 5 * Self.mib, location: "u+1", parts: ["\"e1\""]))
        guard case .send(let part3) = machine.didReceive(ResponseHead(status: 200, headers: ["etag": "\"e2\""]), now: 0) else {
            Issue.record("expected part 3")
            return
        }
        #expect(part3.body == .file(offset: 10 * Self.mib, length: 2 * Self.mib))
        guard case .send(let complete) = machine.didReceive(ResponseHead(status: 200, headers: ["etag": "\"e3\""]), now: 0) else {
            Issue.record("expected complete")
            return
        }
        #expect(complete.method == "POST" && complete.url == "http://s3/b/k?uploadId=u%2B1")
        let expected =
            "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>&quot;e1&quot;</ETag></Part>"
            + "<Part><PartNumber>2</PartNumber><ETag>&quot;e2&quot;</ETag></Part>"
            + "<Part><PartNumber>3</PartNumber><ETag>&quot;e3&quot;</ETag></Part></CompleteMultipartUpload>"
        #expect(complete.body == .bytes(Array(expected.utf8)))
        #expect(
            machine.didReceive(ResponseHead(status: 200, body: xml("<CompleteMultipartUploadResult/>")), now: 0) == .completed)
        #expect(machine.cancellation?.request.method == "DELETE")
    }

    @Test("a 200 carrying an <Error> from Complete is retried, not taken as success")
    func completeError() {
        var machine = S3Upload(
            task: task(size: 12 * Self.mib, chunk: 6 * Self.mib), headers: [],
            checkpoint: TransferCheckpoint(offset: 12 * Self.mib, location: "u", parts: ["a", "b"]))
        _ = machine.start(now: 0)
        _ = machine.didReceive(
            ResponseHead(
                status: 200,
                body: xml(
                    "<ListPartsResult><Part><PartNumber>1</PartNumber><ETag>a</ETag><Size>6291456</Size></Part><Part><PartNumber>2</PartNumber><ETag>b</ETag><Size>6291456</Size></Part></ListPartsResult>"
                )), now: 0)
        #expect(
            machine.didReceive(ResponseHead(status: 200, body: xml("<Error><Code>InternalError</Code></Error>")), now: 0)
                == .failed(.http(status: 500, retryAfter: nil, answers: .s3, code: "InternalError")))
    }

    @Test("resume: ListParts decides, up to the first missing or short part")
    func resume() {
        var machine = S3Upload(
            task: task(size: 20 * Self.mib, chunk: 5 * Self.mib), headers: [],
            checkpoint: TransferCheckpoint(offset: 15 * Self.mib, location: "u", parts: ["a", "b", "c"]))
        guard case .send(let list) = machine.start(now: 0) else {
            Issue.record("expected ListParts")
            return
        }
        #expect(list.method == "GET" && list.url == "http://s3/b/k?uploadId=u")
        let parts =
            "<Part><PartNumber>1</PartNumber><ETag>&quot;a&quot;</ETag><Size>5242880</Size></Part>"
            + "<Part><PartNumber>2</PartNumber><ETag>&quot;b&quot;</ETag><Size>5242880</Size></Part>"
            + "<Part><PartNumber>4</PartNumber><ETag>&quot;d&quot;</ETag><Size>5242880</Size></Part>"
        guard
            case .send(let next) = machine.didReceive(
                ResponseHead(status: 200, body: xml("<ListPartsResult>\(parts)</ListPartsResult>")), now: 0)
        else {
            Issue.record("expected part 3")
            return
        }
        #expect(next.url == "http://s3/b/k?partNumber=3&uploadId=u")
        #expect(machine.etags == ["\"a\"", "\"b\""])
    }

    @Test("resume: a vanished upload (404) starts a new one")
    func vanished() {
        var machine = S3Upload(
            task: task(size: 20 * Self.mib), headers: [], checkpoint: TransferCheckpoint(offset: 0, location: "u"))
        _ = machine.start(now: 0)
        guard case .send(let create) = machine.didReceive(ResponseHead(status: 404), now: 0) else {
            Issue.record("expected a request")
            return
        }
        #expect(create.url == "http://s3/b/k?uploads=")
    }

    @Test("more than 10,000 parts fails -1103 at once")
    func tooManyParts() {
        var machine = S3Upload(task: task(size: 60 << 30, chunk: 5 * Self.mib), headers: [], checkpoint: nil)
        guard case .failed(.fatal(let error)) = machine.start(now: 0) else {
            Issue.record("expected a failure")
            return
        }
        #expect(error.code == -1103)
    }

    func checksummed(size: Int64) -> TaskRecord {
        var record = task(size: size, chunk: 5 * Self.mib)
        record.upload.checksum = .sha256
        return record
    }

    @Test("checksum: SHA256 algorithm at creation, a digest header on every part, part checksums in Complete and the checkpoint")
    func checksumMultipart() {
        var machine = S3Upload(task: checksummed(size: 7 * Self.mib), headers: [], checkpoint: nil)
        guard case .send(let create) = machine.start(now: 0) else {
            Issue.record("expected a request")
            return
        }
        #expect(create.headers.contains { $0 == ("x-amz-checksum-algorithm", "SHA256") })
        guard
            case .send(let part1) = machine.didReceive(
                ResponseHead(
                    status: 200,
                    body: xml("<InitiateMultipartUploadResult><UploadId>u</UploadId></InitiateMultipartUploadResult>")), now: 0)
        else {
            Issue.record("expected part 1")
            return
        }
        #expect(part1.digestHeader == DigestHeader(name: "x-amz-checksum-sha256"))
        // BadDigest: the part was damaged on the way; the attempt ends to send it again.
        let bad = ResponseHead(status: 400, body: xml("<Error><Code>BadDigest</Code></Error>"))
        #expect(machine.didReceive(bad, now: 0) == .failed(.checksumMismatch(status: 400)))
        _ = machine.start(now: 0)
        guard
            case .send(let again) = machine.didReceive(
                ResponseHead(status: 200, body: xml("<ListPartsResult></ListPartsResult>")), now: 0)
        else {
            Issue.record("expected part 1 again")
            return
        }
        #expect(again.url == part1.url && again.digestHeader == part1.digestHeader)
        _ = machine.didReceive(ResponseHead(status: 200, headers: ["etag": "\"e1\"", "x-amz-checksum-sha256": "c1=="]), now: 0)
        #expect(machine.checkpoint?.partChecksums == ["c1=="])
        guard
            case .send(let complete) = machine.didReceive(
                ResponseHead(status: 200, headers: ["etag": "\"e2\"", "x-amz-checksum-sha256": "c2=="]), now: 0),
            case .bytes(let document) = complete.body
        else {
            Issue.record("expected Complete")
            return
        }
        #expect(
            String(decoding: document, as: UTF8.self) == "<CompleteMultipartUpload>"
                + "<Part><PartNumber>1</PartNumber><ETag>&quot;e1&quot;</ETag><ChecksumSHA256>c1==</ChecksumSHA256></Part>"
                + "<Part><PartNumber>2</PartNumber><ETag>&quot;e2&quot;</ETag><ChecksumSHA256>c2==</ChecksumSHA256></Part>"
                + "</CompleteMultipartUpload>")
    }

    @Test("checksum: ListParts on resume brings back each part's checksum")
    func checksumResume() {
        var machine = S3Upload(
            task: checksummed(size: 12 * Self.mib), headers: [],
            checkpoint: TransferCheckpoint(offset: 0, location: "u", parts: []))
        _ = machine.start(now: 0)
        let listing =
            "<ListPartsResult><Part><PartNumber>1</PartNumber><ETag>\"e1\"</ETag><ChecksumSHA256>c1==</ChecksumSHA256>"
            + "<Size>5242880</Size></Part></ListPartsResult>"
        guard case .send(let part2) = machine.didReceive(ResponseHead(status: 200, body: xml(listing)), now: 0) else {
            Issue.record("expected part 2")
            return
        }
        #expect(part2.url.hasPrefix("http://s3/b/k?partNumber=2&"))
        #expect(
            machine.checkpoint
                == TransferCheckpoint(offset: 5 * Self.mib, location: "u", parts: ["\"e1\""], partChecksums: ["c1=="]))
    }

    @Test("checksum: a single PUT carries the digest; without checksums a 400 BadDigest is an ordinary failure")
    func checksumSingle() {
        var machine = S3Upload(task: checksummed(size: 1000), headers: [], checkpoint: nil)
        guard case .send(let put) = machine.start(now: 0) else {
            Issue.record("expected a request")
            return
        }
        #expect(put.digestHeader == DigestHeader(name: "x-amz-checksum-sha256"))
        let bad = ResponseHead(status: 400, body: xml("<Error><Code>BadDigest</Code></Error>"))
        #expect(machine.didReceive(bad, now: 0) == .failed(.checksumMismatch(status: 400)))
        var plain = S3Upload(task: task(size: 1000), headers: [], checkpoint: nil)
        guard case .send(let unsigned) = plain.start(now: 0) else {
            Issue.record("expected a request")
            return
        }
        #expect(unsigned.digestHeader == nil)
        #expect(plain.didReceive(bad, now: 0) == .failed(.http(status: 400, retryAfter: nil, answers: .s3, code: "BadDigest")))
    }
}

@Suite("S3 cancellation")
struct S3CancellationTests {
    let credentials = S3Credentials(region: "eu-west-1", accessKeyID: "AKIA", secretAccessKey: "secret")

    func task(url: String, size: Int64 = 12 << 20, attempts: Int) -> TaskRecord {
        var upload = UploadSpec(protocolName: .s3)
        upload.chunkSize = 5 << 20
        upload.s3 = credentials
        var task = TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/d/f", size: size, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: url, method: "PUT"), upload: upload, createdAt: 0, deadlineAt: 100)
        task.attempts = attempts
        if attempts > 0 { task.startedAt = 1 }
        return task
    }

    @Test(
        "what a cancel releases, by what the task knows",
        arguments: [
            // A known upload id: abort it, signed.
            ("http://h:9/b/k.bin", 1, "u1", "DELETE http://h:9/b/k.bin?uploadId=u1"),
            // It never ran: nothing at the server.
            ("http://h:9/b/k.bin", 0, nil, nil),
            // It ran, the id was never learned: list the key's uploads (path style, keys sorted).
            // The prefix stops before the first character SigV4 would need escaped.
            ("http://h:9/b/dir/k%20x.bin", 1, nil, "GET http://h:9/b?prefix=dir&uploads="),
            ("http://h:9/b/%C3%A9t%C3%A9.bin", 1, nil, "GET http://h:9/b?uploads="),
            // Virtual-hosted style: the bucket is the host.
            (
                "https://bkt.s3.eu-west-1.amazonaws.com/a/k.bin", 2, nil,
                "GET https://bkt.s3.eu-west-1.amazonaws.com/?prefix=a&uploads="
            ),
        ] as [(String, Int, String?, String?)])
    func plans(url: String, attempts: Int, uploadID: String?, expected: String?) {
        let checkpoint = uploadID.map { TransferCheckpoint(offset: 0, location: $0) }
        let machine = S3Upload(task: task(url: url, attempts: attempts), headers: [], checkpoint: checkpoint)
        let plan = machine.cancellation
        #expect(plan.map { "\($0.request.method) \($0.request.url)" } == expected)
        if plan != nil { #expect(plan?.request.signing == credentials) }
    }

    /// An attempt a policy hold stopped is not counted, yet it may have created an upload.
    @Test("a task whose only attempt was not counted still lists its uploads on cancel")
    func beganUncounted() {
        var began = task(url: "http://h:9/b/k.bin", attempts: 0)
        began.startedAt = 5
        let plan = S3Upload(task: began, headers: [], checkpoint: nil).cancellation
        #expect(plan.map { "\($0.request.method) \($0.request.url)" } == "GET http://h:9/b?prefix=k.bin&uploads=")
    }

    @Test("a single-PUT file leaves nothing to release")
    func single() {
        #expect(
            S3Upload(task: task(url: "http://h/b/k", size: 1000, attempts: 3), headers: [], checkpoint: nil).cancellation == nil)
    }

    @Test("the listing's follow-ups: every upload of exactly the key, each aborted")
    func followUps() throws {
        let machine = S3Upload(task: task(url: "http://h:9/b/dir/k.bin", attempts: 1), headers: [], checkpoint: nil)
        let plan = try #require(machine.cancellation)
        let listing = """
            <ListMultipartUploadsResult><Bucket>b</Bucket>
            <Upload><Key>dir/k.bin</Key><UploadId>new+1</UploadId><Initiated>2023-11-14T22:13:21.000Z</Initiated></Upload>
            <Upload><Key>dir/k.bin.old</Key><UploadId>other</UploadId><Initiated>2023-11-14T22:13:25.000Z</Initiated></Upload>
            <Upload><Key>dir/k.bin</Key><UploadId>second</UploadId><Initiated>2020-01-01T00:00:00.000Z</Initiated></Upload>
            </ListMultipartUploadsResult>
            """
        let found = plan.followUps(listing: Array(listing.utf8))
        #expect(found.map(\.uploadID) == ["new+1", "second"])
        #expect(
            found.first.map { "\($0.plan.request.method) \($0.plan.request.url)" }
                == "DELETE http://h:9/b/dir/k.bin?uploadId=new%2B1")
        #expect(found.first?.plan.request.signing == credentials && found.first?.plan.abortListedUploads == nil)
    }

    @Test("the stored form reads back, credentials and listing included")
    func storedForm() throws {
        let machine = S3Upload(
            task: task(url: "http://h:9/b/k.bin", attempts: 1), headers: [("x-amz-content-sha256", "UNSIGNED-PAYLOAD")],
            checkpoint: nil)
        let plan = try #require(machine.cancellation)
        #expect(CleanupPlan.decode(plan.json) == plan)
        #expect(CleanupPlan.decode(["method": "DELETE", "url": "http://h/x", "headers": ["a": 1]]) == nil)
    }
}

/// S3's XML character data: some servers write an ETag's quotes as numeric references
/// (`&#34;…&#34;`); ListParts' ETags go back into CompleteMultipartUpload as they were meant.
@Suite("S3 XML text")
struct XMLTextTests {
    @Test(
        "references decode in one pass: named, decimal, hexadecimal; anything else stays",
        arguments: [
            ("&#34;3858f62230ac3c915f300c664312c11f&#34;", "\"3858f62230ac3c915f300c664312c11f\""),
            ("&#x22;abc&#X22;", "\"abc\""),
            ("&quot;a&quot; &lt;b&gt; &apos;c&apos;", "\"a\" <b> 'c'"),
            ("&amp;quot;", "&quot;"), ("&amp;#34;", "&#34;"), ("a & b", "a & b"), ("&unknown;", "&unknown;"),
            ("&#1114112;", "&#1114112;"), ("&#xD800;", "&#xD800;"), ("&#;", "&#;"), ("tail &", "tail &"),
            ("&#233;t&#xe9;", "été"), ("plain", "plain"),
        ])
    func unescape(_ text: String, _ expected: String) {
        #expect(XMLText.unescape(text) == expected)
    }

    @Test("ListParts with numeric references completes with the ETags as the server gave them")
    func listPartsWithReferences() {
        let body = Array(
            """
            <ListPartsResult><Part><PartNumber>1</PartNumber><ETag>&#34;e1&#34;</ETag><Size>5</Size></Part>\
            <Part><PartNumber>2</PartNumber><ETag>&#x22;e2&#x22;</ETag><Size>5</Size></Part></ListPartsResult>
            """.utf8)
        let parts = S3Upload.contiguousParts(XMLText.blocks("Part", in: body), partSize: 5)
        #expect(parts.map(\.etag) == ["\"e1\"", "\"e2\""])
    }
}
