import BackhaulCore
import Testing

@Suite("IETF resumable upload state machine")
struct IETFUploadStateMachineTests {
    static let url = "http://h:8080/up/clip.mp4"
    static let resource = "http://h:8080/resumable_upload/abc"

    static func task(size: Int64 = 2500, pinned: Int? = nil, checksum: Bool = false, contentType: String? = nil) -> TaskRecord {
        var upload = UploadSpec(protocolName: .ietf)
        upload.interopVersion = pinned
        upload.contentType = contentType
        if checksum { upload.checksum = .sha256 }
        return TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/d/clip.mp4", size: size, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: url, method: "POST"), upload: upload, createdAt: 0, deadlineAt: 100)
    }

    static func resumed(offset: Int64 = 1000, version: Int = 6, location: String = resource) -> TransferCheckpoint {
        var checkpoint = TransferCheckpoint(offset: offset, location: location)
        checkpoint.interopVersion = version
        return checkpoint
    }

    static func version(_ number: Int) -> (String, String) { ("Upload-Draft-Interop-Version", String(number)) }
    static func completeness(_ number: Int) -> (String, String) {
        number < 5 ? ("Upload-Incomplete", "?0") : ("Upload-Complete", "?1")
    }
    static let noExpect = ("Expect", "")

    static func options(_ number: Int = 6) -> TransferStep {
        .send(PlannedRequest(method: "OPTIONS", url: url, headers: [version(number)], body: .empty))
    }

    static func creation(_ number: Int, size: Int64 = 2500) -> TransferStep {
        .send(
            PlannedRequest(
                method: "POST", url: url, headers: [version(number), completeness(number), noExpect],
                body: .file(offset: 0, length: size)))
    }

    static func head(_ number: Int = 6) -> TransferStep {
        .send(PlannedRequest(method: "HEAD", url: resource, headers: [version(number)], body: .empty))
    }

    static func patch(from offset: Int64, _ number: Int = 6, size: Int64 = 2500) -> TransferStep {
        .send(
            PlannedRequest(
                method: "PATCH", url: resource,
                headers: [
                    version(number), ("Upload-Offset", String(offset)), completeness(number),
                    ("Content-Type", "application/partial-upload"), noExpect,
                ], body: .file(offset: offset, length: size - offset)))
    }

    static func informational(_ headers: [String: String], status: Int = 104) -> ResponseHead {
        ResponseHead(status: status, headers: headers)
    }

    // MARK: Version

    @Test(
        "unpinned: OPTIONS names 6; the answer settles the version before any body is sent",
        arguments: [
            (204, ["upload-limit": "min-size=0"], 6),  // Apple's answer: Upload-Limit, no version
            (400, ["upload-draft-interop-version": "3"], 3),  // a refusal naming a version spoken here
            (400, ["upload-draft-interop-version": "5"], 5),
            (200, ["upload-draft-interop-version": "6"], 6),
            (200, ["upload-draft-interop-version": "8"], 6),  // a version not spoken here: try the newest
            (405, [:], 6),  // a server that says nothing
            (404, [:], 6),
        ])
    func negotiation(_ status: Int, _ headers: [String: String], _ expected: Int) {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: nil)
        #expect(machine.start(now: 0) == Self.options())
        #expect(machine.didReceive(ResponseHead(status: status, headers: headers), now: 0) == Self.creation(expected))
        #expect(machine.version == expected)
        #expect(machine.checkpoint?.interopVersion == expected)
    }

    @Test("pinned: no OPTIONS; version 3 says Upload-Incomplete: ?0, 5 and 6 Upload-Complete: ?1", arguments: [3, 5, 6])
    func pinned(_ number: Int) {
        var machine = IETFUpload(task: Self.task(pinned: number), headers: [], checkpoint: nil)
        #expect(machine.start(now: 0) == Self.creation(number))
    }

    @Test("a creation refused naming another version is sent again once in it; unpinned only")
    func creationRefusal() {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        #expect(
            machine.didReceive(ResponseHead(status: 204, headers: ["upload-limit": "min-size=0"]), now: 0) == Self.creation(6))
        #expect(
            machine.didReceive(ResponseHead(status: 400, headers: ["upload-draft-interop-version": "3"]), now: 0)
                == Self.creation(3))
        // Back to a version already refused in this attempt: no ping-pong.
        #expect(
            machine.didReceive(ResponseHead(status: 400, headers: ["upload-draft-interop-version": "6"]), now: 0)
                == .failed(.http(status: 400, retryAfter: nil, answers: .ietf)))

        var pinned = IETFUpload(task: Self.task(pinned: 6), headers: [], checkpoint: nil)
        _ = pinned.start(now: 0)
        #expect(
            pinned.didReceive(ResponseHead(status: 400, headers: ["upload-draft-interop-version": "3"]), now: 0)
                == .failed(.http(status: 400, retryAfter: nil, answers: .ietf)))
    }

    @Test("a stored version not spoken here is asked again, and its upload resource is not used")
    func unknownStoredVersion() {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed(version: 4))
        #expect(machine.start(now: 0) == Self.options())
        #expect(
            machine.didReceive(ResponseHead(status: 204, headers: ["upload-limit": "min-size=0"]), now: 0) == Self.creation(6))
        #expect(machine.location == nil)
    }

    // MARK: Creation and the 104

    @Test("the 104's Location (relative or not) is the upload resource, persisted at once; a 2xx completes")
    func creationWith104() {
        var machine = IETFUpload(task: Self.task(pinned: 6), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        #expect(
            machine.didReceiveInformational(
                Self.informational([
                    "upload-draft-interop-version": "6", "location": "/resumable_upload/abc",
                ])) == true)
        #expect(machine.checkpoint == Self.resumed(offset: 0))
        #expect(
            machine.cancellation
                == CleanupPlan(
                    request: PlannedRequest(
                        method: "DELETE", url: Self.resource, headers: [Self.version(6)],
                        body: .empty)))
        #expect(
            machine.didReceive(ResponseHead(status: 201, headers: ["upload-offset": "2500", "upload-incomplete": "?0"]), now: 0)
                == .completed)
        #expect(machine.bytesAcknowledged == 2500)

        var absolute = IETFUpload(task: Self.task(pinned: 3), headers: [], checkpoint: nil)
        _ = absolute.start(now: 0)
        #expect(
            absolute.didReceiveInformational(
                Self.informational(["upload-draft-interop-version": "3", "location": Self.resource])) == true)
        #expect(absolute.checkpoint == Self.resumed(offset: 0, version: 3))
    }

    @Test(
        "104s of another version, without one, or other 1xx are ignored",
        arguments: [
            (104, ["upload-draft-interop-version": "5", "location": "/resumable_upload/abc"]),
            (104, ["location": "/resumable_upload/abc"]),
            (104, ["upload-draft-interop-version": "6"]),
            (100, ["upload-draft-interop-version": "6", "location": "/resumable_upload/abc"]),
            (103, ["upload-draft-interop-version": "6", "location": "/resumable_upload/abc"]),
        ])
    func ignoredInformational(_ status: Int, _ headers: [String: String]) {
        var machine = IETFUpload(task: Self.task(pinned: 6), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        #expect(machine.didReceiveInformational(Self.informational(headers, status: status)) == false)
        #expect(machine.location == nil && machine.cancellation == nil)
    }

    @Test("later 104s carry progress: Upload-Offset only grows, never past the size; no second Location")
    func progress() {
        var machine = IETFUpload(task: Self.task(pinned: 6), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        #expect(
            machine.didReceiveInformational(
                Self.informational(["upload-draft-interop-version": "6", "location": "/resumable_upload/abc"])) == true)
        #expect(
            machine.didReceiveInformational(Self.informational(["upload-draft-interop-version": "6", "upload-offset": "1000"]))
                == true)
        #expect(machine.bytesAcknowledged == 1000)
        #expect(
            machine.didReceiveInformational(Self.informational(["upload-draft-interop-version": "6", "upload-offset": "900"]))
                == false)
        #expect(
            machine.didReceiveInformational(Self.informational(["upload-draft-interop-version": "6", "upload-offset": "9000"]))
                == false)
        #expect(
            machine.didReceiveInformational(Self.informational(["upload-draft-interop-version": "6", "location": "/other"]))
                == false)
        #expect(machine.checkpoint == Self.resumed(offset: 1000))
    }

    @Test("a success that acknowledges less than the file is a protocol violation")
    func shortSuccess() {
        var machine = IETFUpload(task: Self.task(pinned: 6), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        guard case .failed(.fatal) = machine.didReceive(ResponseHead(status: 201, headers: ["upload-offset": "100"]), now: 0)
        else {
            Issue.record("expected a fatal failure")
            return
        }
    }

    @Test("a plain server (no 104, 2xx) completes; a failure before the 104 keeps nothing to resume")
    func plainServer() {
        var machine = IETFUpload(task: Self.task(pinned: 6), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        #expect(machine.didReceive(ResponseHead(status: 200), now: 0) == .completed)
        var failed = IETFUpload(task: Self.task(pinned: 6), headers: [], checkpoint: nil)
        _ = failed.start(now: 0)
        #expect(
            failed.didReceive(ResponseHead(status: 503, headers: ["retry-after": "7"]), now: 100)
                == .failed(.http(status: 503, retryAfter: 7, answers: .ietf)))
        #expect(failed.checkpoint == TransferCheckpoint(offset: 0).with(version: 6))
    }

    // MARK: Resuming

    @Test(
        "resume: HEAD gives the offset, one PATCH appends the rest (versions 3, 5, 6)",
        arguments: [
            (6, ["upload-offset": "1800", "upload-complete": "?0", "cache-control": "no-store"]),
            (5, ["upload-offset": "1800", "upload-complete": "?0"]),
            (3, ["upload-offset": "1800", "upload-incomplete": "?1"]),
        ])
    func resume(_ number: Int, _ headers: [String: String]) {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed(version: number))
        #expect(machine.start(now: 0) == Self.head(number))
        #expect(machine.didReceive(ResponseHead(status: 204, headers: headers), now: 0) == Self.patch(from: 1800, number))
        #expect(machine.bytesAcknowledged == 1800)
        #expect(machine.didReceive(ResponseHead(status: 201, headers: ["upload-offset": "2500"]), now: 0) == .completed)
        #expect(machine.bytesAcknowledged == 2500)
    }

    @Test("the server may go back (it lost bytes it never acknowledged): the PATCH starts where it says")
    func backtrack() {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed(offset: 2000))
        _ = machine.start(now: 0)
        #expect(
            machine.didReceive(ResponseHead(status: 200, headers: ["upload-offset": "1500", "upload-complete": "?0"]), now: 0)
                == Self.patch(from: 1500))
    }

    @Test(
        "HEAD says the upload is complete (the final answer was lost): done",
        arguments: [
            (6, ["upload-offset": "2500", "upload-complete": "?1"]),
            (3, ["upload-offset": "2500", "upload-incomplete": "?0"]),
        ])
    func alreadyComplete(_ number: Int, _ headers: [String: String]) {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed(version: number))
        _ = machine.start(now: 0)
        #expect(machine.didReceive(ResponseHead(status: 204, headers: headers), now: 0) == .completed)
        #expect(machine.bytesAcknowledged == 2500)
    }

    @Test("every byte there but not complete: an empty PATCH completes it")
    func emptyCompletion() {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed())
        _ = machine.start(now: 0)
        #expect(
            machine.didReceive(ResponseHead(status: 204, headers: ["upload-offset": "2500", "upload-complete": "?0"]), now: 0)
                == Self.patch(from: 2500))
    }

    @Test(
        "HEAD answers that make no sense fail the attempt",
        arguments: [
            (204, ["upload-complete": "?0"]),  // no offset
            (204, ["upload-offset": "abc"]),
            (204, ["upload-offset": "-1"]),
            (204, ["upload-offset": "9999"]),  // more than the file
            (204, ["upload-offset": "100", "upload-complete": "?1"]),  // complete, but not the file's size
        ])
    func badHead(_ status: Int, _ headers: [String: String]) {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed())
        _ = machine.start(now: 0)
        guard case .failed(.fatal) = machine.didReceive(ResponseHead(status: status, headers: headers), now: 0) else {
            Issue.record("expected a fatal failure for \(headers)")
            return
        }
    }

    @Test("a HEAD failing transiently goes to the retry policy and keeps the upload resource")
    func transientHead() {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed())
        _ = machine.start(now: 0)
        #expect(
            machine.didReceive(ResponseHead(status: 503), now: 0) == .failed(.http(status: 503, retryAfter: nil, answers: .ietf)))
        #expect(machine.checkpoint == Self.resumed())
    }

    @Test("404 or 410 to HEAD or PATCH: the server forgot the upload; a new one is created", arguments: [404, 410])
    func forgotten(_ status: Int) {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed())
        _ = machine.start(now: 0)
        #expect(machine.didReceive(ResponseHead(status: status), now: 0) == Self.creation(6))
        #expect(machine.checkpoint == TransferCheckpoint(offset: 0).with(version: 6))
        #expect(machine.cancellation == nil)

        var patching = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed())
        _ = patching.start(now: 0)
        _ = patching.didReceive(ResponseHead(status: 204, headers: ["upload-offset": "1000", "upload-complete": "?0"]), now: 0)
        #expect(patching.didReceive(ResponseHead(status: status), now: 0) == Self.creation(6))
    }

    @Test("409 to a PATCH asks HEAD again, up to maxConflicts times in an attempt")
    func conflicts() {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed())
        _ = machine.start(now: 0)
        let incomplete = ResponseHead(status: 204, headers: ["upload-offset": "1000", "upload-complete": "?0"])
        #expect(machine.didReceive(incomplete, now: 0) == Self.patch(from: 1000))
        for _ in 0..<IETFUpload.maxConflicts {
            #expect(machine.didReceive(ResponseHead(status: 409, headers: ["upload-offset": "1200"]), now: 0) == Self.head())
            #expect(machine.didReceive(incomplete, now: 0) == Self.patch(from: 1000))
        }
        #expect(
            machine.didReceive(ResponseHead(status: 409), now: 0) == .failed(.http(status: 409, retryAfter: nil, answers: .ietf)))
        // A new attempt starts counting again.
        #expect(machine.start(now: 1) == Self.head())
        _ = machine.didReceive(incomplete, now: 1)
        #expect(machine.didReceive(ResponseHead(status: 409), now: 1) == Self.head())
    }

    @Test("a PATCH success that acknowledges less than the file is a protocol violation; a 5xx is retried")
    func patchOutcomes() {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed())
        _ = machine.start(now: 0)
        _ = machine.didReceive(ResponseHead(status: 204, headers: ["upload-offset": "1000", "upload-complete": "?0"]), now: 0)
        guard case .failed(.fatal) = machine.didReceive(ResponseHead(status: 201, headers: ["upload-offset": "2000"]), now: 0)
        else {
            Issue.record("expected a fatal failure")
            return
        }
        var retried = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed())
        _ = retried.start(now: 0)
        _ = retried.didReceive(ResponseHead(status: 204, headers: ["upload-offset": "1000", "upload-complete": "?0"]), now: 0)
        #expect(
            retried.didReceive(ResponseHead(status: 503), now: 0) == .failed(.http(status: 503, retryAfter: nil, answers: .ietf)))
        #expect(retried.checkpoint == Self.resumed())
    }

    @Test("a response when none is expected is a protocol violation")
    func unexpected() {
        var machine = IETFUpload(task: Self.task(pinned: 6), headers: [], checkpoint: nil)
        guard case .failed(.fatal) = machine.didReceive(ResponseHead(status: 200), now: 0) else {
            Issue.record("expected a fatal failure")
            return
        }
    }

    // MARK: Headers

    @Test("the task's headers go on every request; its own interop version header is replaced; Content-Type only on the creation")
    func headers() {
        let given = [("Authorization", "Bearer x"), ("Upload-Draft-Interop-Version", "99"), ("Content-Type", "video/mp4")]
        var machine = IETFUpload(task: Self.task(), headers: given, checkpoint: Self.resumed())
        guard case .send(let head) = machine.start(now: 0) else {
            Issue.record("expected HEAD")
            return
        }
        #expect(head.headers.map(\.0) == ["Authorization", "Content-Type", "Upload-Draft-Interop-Version"])
        #expect(head.headers.last! == ("Upload-Draft-Interop-Version", "6"))
        guard
            case .send(let patch) = machine.didReceive(
                ResponseHead(status: 204, headers: ["upload-offset": "0", "upload-complete": "?0"]),
                now: 0)
        else {
            Issue.record("expected PATCH")
            return
        }
        #expect(patch.headers.filter { $0.0 == "Content-Type" }.map(\.1) == ["application/partial-upload"])

        var typed = IETFUpload(task: Self.task(pinned: 5, contentType: "video/mp4"), headers: [], checkpoint: nil)
        guard case .send(let creation) = typed.start(now: 0) else {
            Issue.record("expected creation")
            return
        }
        #expect(creation.headers.contains { $0 == ("Content-Type", "video/mp4") })
    }

    // MARK: Checksums

    static let reprDigest = DigestHeader(name: "Repr-Digest", prefix: "sha-256=:", suffix: ":", hashedRange: 0..<2500)

    @Test("checksum: OPTIONS asks whether the server wants digests; if so every request carries Repr-Digest of the whole file")
    func digestsWanted() {
        var machine = IETFUpload(task: Self.task(pinned: 6, checksum: true), headers: [], checkpoint: nil)
        #expect(machine.start(now: 0) == Self.options(6))
        guard
            case .send(let creation) = machine.didReceive(
                ResponseHead(status: 204, headers: ["want-repr-digest": "sha-256=10, sha-512=3"]),
                now: 0)
        else {
            Issue.record("expected creation")
            return
        }
        #expect(creation.digestHeader == Self.reprDigest && machine.digestsWanted == true)

        var resumed = IETFUpload(task: Self.task(checksum: true), headers: [], checkpoint: Self.resumed(version: 5))
        #expect(resumed.start(now: 0) == Self.options(5))
        #expect(
            resumed.didReceive(ResponseHead(status: 200, headers: ["want-content-digest": "sha-256=1"]), now: 0) == Self.head(5))
        guard
            case .send(let patch) = resumed.didReceive(
                ResponseHead(status: 204, headers: ["upload-offset": "2000", "upload-complete": "?0"]),
                now: 0)
        else {
            Issue.record("expected PATCH")
            return
        }
        #expect(patch.digestHeader == Self.reprDigest && patch.body == .file(offset: 2000, length: 500))
    }

    @Test(
        "checksum: a server that does not want sha-256 gets no digest",
        arguments: [
            (204, [:]),
            (204, ["want-repr-digest": "sha-256=0"]),  // weight 0: not acceptable
            (204, ["want-repr-digest": "sha-512=5"]),
            (405, ["want-repr-digest": "sha-256=5"]),  // not a success
        ])
    func digestsNotWanted(_ status: Int, _ headers: [String: String]) {
        var machine = IETFUpload(task: Self.task(pinned: 6, checksum: true), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        #expect(machine.didReceive(ResponseHead(status: status, headers: headers), now: 0) == Self.creation(6))
        #expect(machine.digestsWanted == false)
    }

    @Test("without checksum: no OPTIONS when the version is known")
    func noChecksumNoOptions() {
        var machine = IETFUpload(task: Self.task(), headers: [], checkpoint: Self.resumed())
        #expect(machine.start(now: 0) == Self.head())
    }

    // MARK: Checkpoint

    @Test("the checkpoint round-trips through JSON with its version")
    func checkpointJSON() {
        let checkpoint = Self.resumed(offset: 77)
        #expect(TransferCheckpoint(checkpoint.json) == checkpoint)
        #expect(checkpoint.json["interop_version"]?.intValue == 6)
    }
}

extension TransferCheckpoint {
    func with(version: Int) -> TransferCheckpoint {
        var copy = self
        copy.interopVersion = version
        return copy
    }
}
