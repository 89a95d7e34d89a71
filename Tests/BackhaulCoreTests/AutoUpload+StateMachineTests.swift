import BackhaulCore
import JSONCodec
import Testing

@Suite("auto: protocol selection")
struct AutoUploadStateMachineTests {
    static let url = "http://h:8080/files"
    static let resource = "http://h:8080/resumable_upload/abc"

    static func task(size: Int64 = 2500, pinned: Int? = nil) -> TaskRecord {
        var upload = UploadSpec(protocolName: .auto)
        upload.chunkSize = 1000
        upload.interopVersion = pinned
        return TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/d/clip.mp4", size: size, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: url, method: "PUT"), upload: upload, createdAt: 0, deadlineAt: 100)
    }

    static let probe = TransferStep.send(
        PlannedRequest(
            method: "OPTIONS", url: url, headers: [("Upload-Draft-Interop-Version", "6")],
            body: .empty))

    // MARK: The rules

    @Test(
        "the answer to OPTIONS picks ietf, else tus, else raw",
        arguments: [
            (204, ["upload-limit": "min-size=0"], ProtocolSelection.Choice(.ietf, interopVersion: 6)),  // Apple's server
            // Refused 6, speaks 3:
            (400, ["upload-draft-interop-version": "3"], ProtocolSelection.Choice(.ietf, interopVersion: 3)),
            (
                200, ["upload-draft-interop-version": "5", "tus-resumable": "1.0.0"],
                ProtocolSelection.Choice(.ietf, interopVersion: 5)
            ),
            (200, ["upload-draft-interop-version": "9"], ProtocolSelection.Choice(.ietf, interopVersion: 6)),
            (
                204, ["tus-resumable": "1.0.0", "tus-version": "1.0.0", "tus-extension": "creation"],
                ProtocolSelection.Choice(.tus)
            ),
            (204, ["tus-version": "1.0.0"], ProtocolSelection.Choice(.tus)),
            (200, ["tus-resumable": "1.0.0"], ProtocolSelection.Choice(.tus)),
            (200, ["allow": "GET, PUT"], ProtocolSelection.Choice(.raw)),
            (405, [:], ProtocolSelection.Choice(.raw)),  // nginx
            (404, [:], ProtocolSelection.Choice(.raw)),
            (403, [:], ProtocolSelection.Choice(.raw)),
            (501, ["upload-limit": "min-size=0"], nil),  // a server error decides nothing
            (503, [:], nil),
            (429, ["tus-resumable": "1.0.0"], nil),
            (408, [:], nil),
            (401, [:], nil),  // the credentials first
            (407, [:], nil),
        ] as [(Int, [String: String], ProtocolSelection.Choice?)])
    func rules(_ status: Int, _ headers: [String: String], _ expected: ProtocolSelection.Choice?) {
        #expect(ProtocolSelection.choose(ResponseHead(status: status, headers: headers)) == expected)
    }

    @Test("the question: OPTIONS on request.url with the task's headers and the newest interop version")
    func question() {
        let probe = ProtocolSelection.probe(
            url: Self.url, headers: [("Authorization", "Bearer x"), ("upload-draft-interop-version", "1")])
        #expect(
            probe
                == PlannedRequest(
                    method: "OPTIONS", url: Self.url,
                    headers: [("Authorization", "Bearer x"), ("Upload-Draft-Interop-Version", "6")], body: .empty))
    }

    // MARK: The machine

    @Test(
        "ietf picked: the creation follows at the version found (no second OPTIONS); the 104 and the pick are in the checkpoint")
    func picksIETF() {
        var machine = AutoUpload(task: Self.task(), headers: [], checkpoint: nil)
        #expect(machine.start(now: 0) == Self.probe)
        #expect(machine.checkpoint?.protocolSelected == nil)
        guard
            case .send(let creation) = machine.didReceive(
                ResponseHead(status: 400, headers: ["upload-draft-interop-version": "3"]), now: 0)
        else {
            Issue.record("expected the creation")
            return
        }
        #expect(creation.method == "PUT" && creation.url == Self.url && creation.body == .file(offset: 0, length: 2500))
        #expect(creation.headers.contains { $0 == ("Upload-Draft-Interop-Version", "3") })
        #expect(creation.headers.contains { $0 == ("Upload-Incomplete", "?0") })
        #expect(machine.selection == ProtocolSelection.Choice(.ietf, interopVersion: 3))
        #expect(
            machine.didReceiveInformational(
                ResponseHead(
                    status: 104,
                    headers: [
                        "upload-draft-interop-version": "3", "location": Self.resource,
                    ])) == true)
        var expected = TransferCheckpoint(offset: 0, location: Self.resource)
        expected.interopVersion = 3
        expected.protocolSelected = .ietf
        #expect(machine.checkpoint == expected)
        #expect(machine.cancellation?.request.method == "DELETE" && machine.cancellation?.request.url == Self.resource)
        #expect(machine.didReceive(ResponseHead(status: 201), now: 0) == .completed)
        #expect(machine.bytesAcknowledged == 2500)
    }

    @Test("a pinned interop version wins over the one the OPTIONS found")
    func pinnedWins() {
        var machine = AutoUpload(task: Self.task(pinned: 5), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        guard
            case .send(let creation) = machine.didReceive(
                ResponseHead(status: 204, headers: ["upload-limit": "min-size=0"]), now: 0)
        else {
            Issue.record("expected the creation")
            return
        }
        #expect(creation.headers.contains { $0 == ("Upload-Draft-Interop-Version", "5") })
    }

    @Test("tus picked: tus creation at request.url (POST), then PATCHes of chunk_size")
    func picksTus() {
        var machine = AutoUpload(task: Self.task(), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        guard
            case .send(let creation) = machine.didReceive(ResponseHead(status: 204, headers: ["tus-resumable": "1.0.0"]), now: 0)
        else {
            Issue.record("expected the tus creation")
            return
        }
        #expect(creation.method == "POST" && creation.headers.contains { $0 == ("Upload-Length", "2500") })
        guard case .send(let patch) = machine.didReceive(ResponseHead(status: 201, headers: ["location": "/files/abc"]), now: 0)
        else {
            Issue.record("expected a PATCH")
            return
        }
        #expect(patch.method == "PATCH" && patch.body == .file(offset: 0, length: 1000))
        #expect(machine.checkpoint?.protocolSelected == .tus && machine.checkpoint?.location == "http://h:8080/files/abc")
        #expect(machine.checkpoint?.interopVersion == nil)
    }

    @Test("raw picked: the file as the body of request.method; 2xx completes")
    func picksRaw() {
        var machine = AutoUpload(task: Self.task(), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        #expect(
            machine.didReceive(ResponseHead(status: 405), now: 0)
                == .send(PlannedRequest(method: "PUT", url: Self.url, headers: [], body: .file(offset: 0, length: 2500))))
        #expect(machine.checkpoint?.protocolSelected == .raw)
        #expect(machine.didReceive(ResponseHead(status: 201), now: 0) == .completed)
        #expect(machine.cancellation == nil)
    }

    @Test("an OPTIONS failing transiently ends the attempt (asked again at the retry); 401 goes to authentication")
    func undecided() {
        var machine = AutoUpload(task: Self.task(), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        #expect(machine.didReceive(ResponseHead(status: 503), now: 0) == .failed(.http(status: 503, retryAfter: nil)))
        #expect(machine.selection == nil)
        #expect(machine.start(now: 1) == Self.probe)
        #expect(machine.didReceive(ResponseHead(status: 401), now: 1) == .failed(.http(status: 401, retryAfter: nil)))
    }

    @Test("a task that picked keeps its pick across restarts: no OPTIONS, the picked protocol resumes")
    func keepsPick() {
        var checkpoint = TransferCheckpoint(offset: 1000, location: "http://h:8080/files/abc")
        checkpoint.protocolSelected = .tus
        var machine = AutoUpload(
            task: Self.task(), headers: [], checkpoint: checkpoint,
            cachedSelection: ProtocolSelection.Choice(.raw))
        guard case .send(let head) = machine.start(now: 0) else {
            Issue.record("expected HEAD")
            return
        }
        #expect(head.method == "HEAD" && head.url == "http://h:8080/files/abc")
        #expect(machine.selection == ProtocolSelection.Choice(.tus))
    }

    @Test("a pick cached for the host is used without asking, and written to the checkpoint")
    func cached() {
        var machine = AutoUpload(
            task: Self.task(), headers: [], checkpoint: nil,
            cachedSelection: ProtocolSelection.Choice(.ietf, interopVersion: 5))
        guard case .send(let creation) = machine.start(now: 0) else {
            Issue.record("expected the creation")
            return
        }
        #expect(creation.headers.contains { $0 == ("Upload-Draft-Interop-Version", "5") })
        #expect(machine.checkpoint?.protocolSelected == .ietf && machine.checkpoint?.interopVersion == 5)
    }

    @Test(
        "the server forgot the picked protocol's upload (404/410 on its resource): ask again, start afresh, say so",
        arguments: [404, 410])
    func fallback(_ status: Int) throws {
        var checkpoint = TransferCheckpoint(offset: 1000, location: Self.resource)
        checkpoint.protocolSelected = .ietf
        checkpoint.interopVersion = 6
        var machine = AutoUpload(task: Self.task(), headers: [], checkpoint: checkpoint)
        guard case .send(let head) = machine.start(now: 0) else {
            Issue.record("expected HEAD")
            return
        }
        #expect(head.method == "HEAD" && head.url == Self.resource)
        #expect(machine.didReceive(ResponseHead(status: status), now: 0) == Self.probe)
        #expect(machine.selection == nil && machine.bytesAcknowledged == 0 && machine.cancellation == nil)
        #expect(
            machine.didReceive(ResponseHead(status: 405), now: 0)
                == .send(PlannedRequest(method: "PUT", url: Self.url, headers: [], body: .file(offset: 0, length: 2500))))
        let saved = machine.checkpoint
        #expect(saved?.protocolSelected == .raw && saved?.location == nil && saved?.interopVersion == nil)
        #expect(saved?.fallback == ProtocolFallback(from: .ietf, status: status))
        // The task says so.
        var task = Self.task()
        task.checkpoint = saved
        let upload = try Self.shownUpload(task)
        #expect(upload?["protocol_selected"]?.stringValue == "raw")
        #expect(upload?["protocol_fallback"]?["from"]?.stringValue == "ietf")
        #expect(upload?["protocol_fallback"]?["status"]?.intValue == Int64(status))
        #expect(upload?["protocol_fallback"]?["reason"]?.stringValue?.contains("picked again") == true)
        // And it is kept across restarts.
        #expect(TransferCheckpoint(saved!.json) == saved)
    }

    @Test("a 404 that is not about the upload resource (the creation URL itself) is an ordinary failure")
    func creationNotFound() {
        var machine = AutoUpload(task: Self.task(), headers: [], checkpoint: nil, cachedSelection: ProtocolSelection.Choice(.raw))
        _ = machine.start(now: 0)
        #expect(machine.didReceive(ResponseHead(status: 404), now: 0) == .failed(.http(status: 404, retryAfter: nil)))
        #expect(machine.fallback == nil)
    }

    @Test("the task shows protocol_selected (null until picked) and the ietf version in use")
    func taskView() throws {
        var task = Self.task()
        var upload = try Self.shownUpload(task)
        #expect(upload?["protocol_selected"] == .null)
        #expect(upload?["protocol_fallback"] == .null)
        #expect(upload?["chunk_size"]?.intValue == 1000)
        var checkpoint = TransferCheckpoint(offset: 0)
        checkpoint.protocolSelected = .ietf
        checkpoint.interopVersion = 5
        task.checkpoint = checkpoint
        upload = try Self.shownUpload(task)
        #expect(upload?["protocol_selected"]?.stringValue == "ietf")
        #expect(upload?["interop_version_selected"]?.intValue == 5)
        #expect(upload?["interop_version"] == .null)
    }

    /// The `upload` member of the task as the API shows it.
    static func shownUpload(_ task: TaskRecord) throws -> JSON? { try JSON.parse(task.jsonText())["upload"] }

    @Test("a checkpoint naming an unknown protocol or a malformed fallback does not parse (the store calls it corrupt)")
    func corruptCheckpoint() throws {
        #expect(TransferCheckpoint(try JSON.parse(#"{"offset": 0, "protocol_selected": "ftp"}"#)) == nil)
        #expect(TransferCheckpoint(try JSON.parse(#"{"offset": 0, "fallback": {"from": "x"}}"#)) == nil)
    }
}
