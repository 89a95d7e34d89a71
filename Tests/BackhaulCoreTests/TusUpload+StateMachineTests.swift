import BackhaulCore
import Testing

@Suite("tus upload state machine")
struct TusUploadStateMachineTests {
    func task(size: Int64 = 2500) -> TaskRecord {
        var upload = UploadSpec(protocolName: .tus)
        upload.chunkSize = 1000
        upload.contentType = "video/mp4"
        return TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/d/clip.mp4", size: size, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: "http://h:1080/files", method: "POST"), upload: upload, createdAt: 0, deadlineAt: 100)
    }

    let tus = ("Tus-Resumable", "1.0.0")

    func patch(_ offset: Int64, _ length: Int64, at url: String = "http://h:1080/files/abc") -> TransferStep {
        .send(
            PlannedRequest(
                method: "PATCH", url: url,
                headers: [
                    tus, ("Upload-Offset", String(offset)),
                    ("Content-Type", "application/offset+octet-stream"),
                ],
                body: .file(offset: offset, length: length)))
    }

    @Test("creation, then PATCHes; the Location (relative or not) becomes the checkpoint")
    func creation() {
        var machine = TusUpload(task: task(), headers: [], checkpoint: nil)
        guard case .send(let create) = machine.start(now: 0) else {
            Issue.record("expected a request")
            return
        }
        #expect(create.method == "POST")
        #expect(create.headers.contains { $0 == ("Upload-Length", "2500") })
        // filename clip.mp4, filetype video/mp4, base64
        #expect(create.headers.contains { $0 == ("Upload-Metadata", "filename Y2xpcC5tcDQ=,filetype dmlkZW8vbXA0") })
        #expect(create.headers.contains { $0 == tus })
        #expect(machine.didReceive(ResponseHead(status: 201, headers: ["location": "/files/abc"]), now: 0) == patch(0, 1000))
        #expect(machine.checkpoint == TransferCheckpoint(offset: 0, location: "http://h:1080/files/abc"))
        #expect(machine.didReceive(ResponseHead(status: 204, headers: ["upload-offset": "1000"]), now: 0) == patch(1000, 1000))
        #expect(machine.didReceive(ResponseHead(status: 204, headers: ["upload-offset": "2000"]), now: 0) == patch(2000, 500))
        #expect(machine.didReceive(ResponseHead(status: 204, headers: ["upload-offset": "2500"]), now: 0) == .completed)
        #expect(machine.cancellation?.request.method == "DELETE")
    }

    @Test("resume: HEAD gives the server's offset")
    func resume() {
        var machine = TusUpload(
            task: task(), headers: [], checkpoint: TransferCheckpoint(offset: 1000, location: "http://h:1080/files/abc"))
        #expect(
            machine.start(now: 0)
                == .send(PlannedRequest(method: "HEAD", url: "http://h:1080/files/abc", headers: [tus], body: .empty)))
        #expect(machine.didReceive(ResponseHead(status: 200, headers: ["upload-offset": "1800"]), now: 0) == patch(1800, 700))
    }

    @Test("409 offset mismatch re-syncs with HEAD instead of failing")
    func conflict() {
        var machine = TusUpload(
            task: task(), headers: [], checkpoint: TransferCheckpoint(offset: 0, location: "http://h:1080/files/abc"))
        _ = machine.start(now: 0)
        _ = machine.didReceive(ResponseHead(status: 200, headers: ["upload-offset": "0"]), now: 0)
        #expect(
            machine.didReceive(ResponseHead(status: 409), now: 0)
                == .send(PlannedRequest(method: "HEAD", url: "http://h:1080/files/abc", headers: [tus], body: .empty)))
        #expect(machine.didReceive(ResponseHead(status: 200, headers: ["upload-offset": "1000"]), now: 0) == patch(1000, 1000))
    }

    @Test("an expired upload (404 or 410 to HEAD) starts a new one", arguments: [404, 410])
    func expired(_ status: Int) {
        var machine = TusUpload(
            task: task(), headers: [], checkpoint: TransferCheckpoint(offset: 1000, location: "http://h:1080/files/abc"))
        _ = machine.start(now: 0)
        guard case .send(let request) = machine.didReceive(ResponseHead(status: status), now: 0) else {
            Issue.record("expected a request")
            return
        }
        #expect(request.method == "POST")
        #expect(machine.bytesAcknowledged == 0)
    }

    @Test("server errors go to the retry policy; nonsense offsets are refused")
    func failures() {
        var machine = TusUpload(task: task(), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        #expect(
            machine.didReceive(ResponseHead(status: 503), now: 0) == .failed(.http(status: 503, retryAfter: nil, answers: .tus)))
        var backwards = TusUpload(
            task: task(), headers: [], checkpoint: TransferCheckpoint(offset: 0, location: "http://h:1080/files/abc"))
        _ = backwards.start(now: 0)
        _ = backwards.didReceive(ResponseHead(status: 200, headers: ["upload-offset": "1000"]), now: 0)
        guard case .failed(.fatal) = backwards.didReceive(ResponseHead(status: 204, headers: ["upload-offset": "500"]), now: 0)
        else {
            Issue.record("an offset going backwards must fail")
            return
        }
    }

    /// Found by hostile peers: a HEAD after a failed PATCH answered `Upload-Offset: -5`, and the
    /// machine sent a PATCH at -5. An offset that is not a plain count within the file is a lie.
    @Test(
        "a HEAD's Upload-Offset that is negative, signed or past the size is refused",
        arguments: ["-5", "-0", "+1000", "2501", " 1000", "1e3", "99999999999999999999"])
    func hostileProbe(_ value: String) {
        var machine = TusUpload(
            task: task(), headers: [], checkpoint: TransferCheckpoint(offset: 1000, location: "http://h:1080/files/abc"))
        _ = machine.start(now: 0)
        guard
            case .failed(.fatal(let error)) = machine.didReceive(
                ResponseHead(status: 200, headers: ["upload-offset": value]), now: 0)
        else {
            Issue.record("Upload-Offset \(value) must fail the attempt as a bad server response")
            return
        }
        #expect(error.code == TaskError.Kind.badServerResponse.rawValue)
        #expect(machine.bytesAcknowledged == 1000)
    }

    @Test("a creation or PATCH answer with a signed Upload-Offset is refused", arguments: ["-5", "+1000", "-0"])
    func hostileAcknowledgement(_ value: String) {
        var created = TusUpload(task: task(), headers: [], checkpoint: nil)
        _ = created.start(now: 0)
        guard
            case .failed(.fatal) = created.didReceive(
                ResponseHead(status: 201, headers: ["location": "/files/abc", "upload-offset": value]), now: 0)
        else {
            Issue.record("a creation at \(value) must fail")
            return
        }
        var patched = TusUpload(task: task(), headers: [], checkpoint: nil)
        _ = patched.start(now: 0)
        _ = patched.didReceive(ResponseHead(status: 201, headers: ["location": "/files/abc"]), now: 0)
        guard case .failed(.fatal) = patched.didReceive(ResponseHead(status: 204, headers: ["upload-offset": value]), now: 0)
        else {
            Issue.record("a PATCH acknowledged at \(value) must fail")
            return
        }
    }

    func checksummed() -> TaskRecord {
        var record = task()
        record.upload.checksum = .sha256
        return record
    }

    static let offersSHA256 = ["tus-extension": "creation, checksum,termination", "tus-checksum-algorithm": "sha1, sha256"]

    @Test("checksum: OPTIONS first; an offer of sha256 puts Upload-Checksum on every PATCH; 460 sends the chunk again")
    func checksumOffered() {
        var machine = TusUpload(
            task: checksummed(), headers: [], checkpoint: TransferCheckpoint(offset: 1000, location: "http://h:1080/files/abc"))
        #expect(
            machine.start(now: 0)
                == .send(PlannedRequest(method: "OPTIONS", url: "http://h:1080/files", headers: [tus], body: .empty)))
        guard case .send(let head) = machine.didReceive(ResponseHead(status: 204, headers: Self.offersSHA256), now: 0) else {
            Issue.record("expected HEAD")
            return
        }
        #expect(head.method == "HEAD" && machine.checksumOffered == true)
        guard case .send(let patch) = machine.didReceive(ResponseHead(status: 200, headers: ["upload-offset": "1000"]), now: 0)
        else {
            Issue.record("expected PATCH")
            return
        }
        #expect(patch.digestHeader == DigestHeader(name: "Upload-Checksum", prefix: "sha256 "))
        #expect(machine.didReceive(ResponseHead(status: 460), now: 0) == .failed(.checksumMismatch(status: 460)))
    }

    @Test(
        "checksum: a server without the extension (or without sha256, or failing OPTIONS) gets plain PATCHes",
        arguments: [
            (204, ["tus-extension": "creation,termination"]),
            (204, ["tus-extension": "checksum", "tus-checksum-algorithm": "sha1,md5"]),
            (405, [:]),
        ])
    func checksumNotOffered(_ status: Int, _ headers: [String: String]) {
        var machine = TusUpload(task: checksummed(), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        guard case .send(let create) = machine.didReceive(ResponseHead(status: status, headers: headers), now: 0) else {
            Issue.record("expected creation")
            return
        }
        #expect(create.method == "POST" && machine.checksumOffered == false)
        #expect(machine.didReceive(ResponseHead(status: 201, headers: ["location": "/files/abc"]), now: 0) == patch(0, 1000))
    }
}
