import BackhaulCore
import JSONCodec
import Testing

/// docs/operations.md "One bad task never stops the daemon": a protocol state that no attempt can have
/// written (read back from the store as it is, without the API's validators) fails that task with
/// `-3100 internal_error` on every attempt; values from the stored row or from the server never
/// trap in the machines' arithmetic.
@Suite("impossible protocol states fail the task with internal_error")
struct ImpossibleStateTests {
    static let mib: Int64 = 1 << 20

    static func task(_ name: UploadProtocol, size: Int64 = 2500, chunk: Int64? = 1000, pinned: Int? = nil) -> TaskRecord {
        var upload = UploadSpec(protocolName: name)
        upload.chunkSize = chunk
        upload.interopVersion = pinned
        if name == .s3 { upload.s3 = S3Credentials(region: "eu-west-1", accessKeyID: "AKIA", secretAccessKey: "secret") }
        return TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/d/clip.mp4", size: size, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: "http://h:8080/files", method: "PUT"), upload: upload, createdAt: 0, deadlineAt: 100)
    }

    static func checkpoint(
        offset: Int64, location: String? = nil, parts: [String] = [], version: Int? = nil, picked: UploadProtocol? = nil
    ) -> TransferCheckpoint {
        var checkpoint = TransferCheckpoint(offset: offset, location: location, parts: parts)
        checkpoint.interopVersion = version
        checkpoint.protocolSelected = picked
        return checkpoint
    }

    /// The task's failure when `step` is the `internal_error` one, nil otherwise.
    static func internalError(_ step: TransferStep) -> TaskError? {
        guard case .failed(.fatal(let error)) = step, error.code == -3100, error.name == "internal_error" else { return nil }
        return error
    }

    struct Case: CustomTestStringConvertible, Sendable {
        var testDescription: String
        var task: TaskRecord
        var checkpoint: TransferCheckpoint?
        /// Words the failure's message must hold.
        var says: String
    }

    static let cases: [Case] = [
        Case(
            testDescription: "tus: acknowledged bytes without an upload URL",
            task: task(.tus), checkpoint: checkpoint(offset: 1000), says: "names no tus upload URL"),
        Case(
            testDescription: "tus: a negative offset",
            task: task(.tus), checkpoint: checkpoint(offset: -1, location: "http://h:8080/files/abc"),
            says: "negative offset -1"),
        Case(
            testDescription: "s3: parts without an UploadId",
            task: task(.s3, size: 20 * mib, chunk: nil), checkpoint: checkpoint(offset: 8 * mib, parts: ["\"e1\""]),
            says: "no multipart UploadId"),
        Case(
            testDescription: "ietf: an upload resource without its interop version",
            task: task(.ietf), checkpoint: checkpoint(offset: 1000, location: "http://h:8080/resumable_upload/abc"),
            says: "not the interop version"),
        Case(
            testDescription: "ietf pinned: an upload resource without its interop version",
            task: task(.ietf, pinned: 6), checkpoint: checkpoint(offset: 0, location: "http://h:8080/resumable_upload/abc"),
            says: "not the interop version"),
        Case(
            testDescription: "ietf: a pinned version not spoken here",
            task: task(.ietf, pinned: 4), checkpoint: nil, says: "pins interop version 4"),
        Case(
            testDescription: "ietf: a negative offset",
            task: task(.ietf), checkpoint: checkpoint(offset: -7, location: "http://h:8080/resumable_upload/abc", version: 6),
            says: "negative offset -7"),
        Case(
            testDescription: "chunked: a negative offset",
            task: task(.chunked), checkpoint: checkpoint(offset: -5), says: "negative offset -5"),
        Case(
            testDescription: "auto: a pick auto never makes",
            task: task(.auto), checkpoint: checkpoint(offset: 0, picked: .s3), says: "auto picked s3"),
        Case(
            testDescription: "auto picked tus: acknowledged bytes without an upload URL",
            task: task(.auto), checkpoint: checkpoint(offset: 1000, picked: .tus), says: "names no tus upload URL"),
        Case(
            testDescription: "auto picked ietf: an upload resource without its interop version",
            task: task(.auto),
            checkpoint: checkpoint(offset: 1000, location: "http://h:8080/resumable_upload/abc", picked: .ietf),
            says: "not the interop version"),
        // Found by the fuzz target `row` (its hour-long campaign): a stored file size of -84 had the
        // tus machine plan a creation body "at 0 length 0 of a file of -84".
        Case(
            testDescription: "tus: a negative file size", task: task(.tus, size: -84), checkpoint: nil,
            says: "negative file size -84"),
        Case(
            testDescription: "raw: a negative file size", task: task(.raw, size: -1, chunk: nil), checkpoint: nil,
            says: "negative file size -1"),
        Case(
            testDescription: "s3: a negative file size", task: task(.s3, size: -3, chunk: nil), checkpoint: nil,
            says: "negative file size -3"),
    ]

    @Test("each impossible stored state fails the attempt with -3100, and the next attempt again", arguments: cases)
    func impossibleStoredState(_ row: Case) {
        var stored = row.task
        stored.checkpoint = row.checkpoint
        var machine = TransferMachines.machine(for: stored, headers: [])
        for _ in 0..<2 {
            let step = machine.start(now: 0)
            let error = Self.internalError(step)
            #expect(error != nil, "\(step)")
            #expect(error?.message.contains(row.says) == true, "\(error?.message ?? "no internal_error")")
            // Found by the fuzz target `tus`: the bytes shown (`bytes_sent`) were the stored -5.
            #expect(machine.bytesAcknowledged >= 0, "\(machine.bytesAcknowledged) bytes acknowledged")
            // No retry: the planner ends the task at this attempt, with this error.
            guard case .failed(let failure) = step, let error else { continue }
            #expect(
                RetryPlanner.decide(failure, attempts: 1, policy: RetryPolicy(), now: 0, deadline: 100, random: { 0.5 })
                    == .fail(error))
        }
    }

    @Test("the states next to them are not broken: nothing stored yet, a single S3 PUT done, a version from another build")
    func neighbours() {
        var tus = TusUpload(task: Self.task(.tus), headers: [], checkpoint: Self.checkpoint(offset: 0))
        #expect(Self.request(tus.start(now: 0))?.method == "POST")
        var single = S3Upload(task: Self.task(.s3, chunk: nil), headers: [], checkpoint: Self.checkpoint(offset: 2500))
        #expect(Self.request(single.start(now: 0))?.method == "PUT")
        var multipart = S3Upload(
            task: Self.task(.s3, size: 20 * Self.mib, chunk: nil), headers: [], checkpoint: Self.checkpoint(offset: 0))
        #expect(Self.request(multipart.start(now: 0))?.url == "http://h:8080/files?uploads=")
        var ietf = IETFUpload(
            task: Self.task(.ietf), headers: [],
            checkpoint: Self.checkpoint(offset: 1000, location: "http://h:8080/resumable_upload/abc", version: 4))
        #expect(Self.request(ietf.start(now: 0))?.method == "OPTIONS")
        var completedIETF = IETFUpload(
            task: Self.task(.ietf, pinned: 6), headers: [], checkpoint: Self.checkpoint(offset: 2500, version: 6))
        #expect(Self.request(completedIETF.start(now: 0))?.method == "PUT")
    }

    static func request(_ step: TransferStep) -> PlannedRequest? {
        guard case .send(let request) = step else { return nil }
        return request
    }

    // MARK: Values that trapped

    @Test("tus: a stored chunk_size of Int64.max resumes with the rest of the file in one PATCH")
    func tusHugeChunk() {
        var machine = TusUpload(
            task: Self.task(.tus, chunk: .max), headers: [],
            checkpoint: Self.checkpoint(offset: 1000, location: "http://h:8080/files/abc"))
        #expect(Self.request(machine.start(now: 0))?.method == "HEAD")
        let patch = Self.request(machine.didReceive(ResponseHead(status: 200, headers: ["upload-offset": "1000"]), now: 0))
        #expect(patch?.body == .file(offset: 1000, length: 1500))
    }

    @Test("chunked: a stored chunk_size of Int64.max resumes with the rest of the file in one piece")
    func chunkedHugeChunk() {
        var machine = ChunkedUpload(
            task: Self.task(.chunked, chunk: .max), headers: [], checkpoint: Self.checkpoint(offset: 1000))
        #expect(Self.request(machine.start(now: 0))?.headers.contains { $0 == ("Content-Range", "bytes */2500") } == true)
        let next = Self.request(machine.didReceive(ResponseHead(status: 308, headers: ["range": "bytes=0-999"]), now: 0))
        #expect(next?.headers.contains { $0 == ("Content-Range", "bytes 1000-2499/2500") } == true)
    }

    @Test("chunked: a Range that would overflow or is negative is not the server's account")
    func chunkedRangeOverflow() {
        var machine = ChunkedUpload(task: Self.task(.chunked), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        let next = Self.request(
            machine.didReceive(ResponseHead(status: 308, headers: ["range": "bytes=0-9223372036854775807"]), now: 0))
        #expect(next?.headers.contains { $0 == ("Content-Range", "bytes 1000-1999/2500") } == true)
        // A server that claims every byte (or more) after an intermediate chunk broke the protocol.
        let claimed = machine.didReceive(ResponseHead(status: 308, headers: ["range": "bytes=0-4999"]), now: 0)
        guard case .failed(.fatal(let error)) = claimed else {
            Issue.record("expected a failure, got \(claimed)")
            return
        }
        #expect(error.code == -1011)
    }

    @Test("s3: a stored chunk_size of Int64.max is S3's largest part, not an overflow")
    func s3HugeChunk() {
        #expect(S3Upload.partSize(.max) == 5 << 30)
        var machine = S3Upload(task: Self.task(.s3, chunk: .max), headers: [], checkpoint: nil)
        #expect(Self.request(machine.start(now: 0))?.body == .file(offset: 0, length: 2500))
    }

    @Test("tus: a creation answered with an offset outside the file broke the protocol (-1011)")
    func tusCreationOffset() {
        for offset in ["99999", "-3"] {
            var machine = TusUpload(task: Self.task(.tus), headers: [], checkpoint: nil)
            _ = machine.start(now: 0)
            let step = machine.didReceive(
                ResponseHead(status: 201, headers: ["location": "/files/abc", "upload-offset": offset]), now: 0)
            guard case .failed(.fatal(let error)) = step else {
                Issue.record("expected a failure for \(offset), got \(step)")
                continue
            }
            #expect(error.code == -1011)
        }
    }

    @Test("an attempt count at the ends of Int from the stored row moves without trapping")
    func attemptCountBounds() throws {
        var queued = Self.task(.raw)
        queued.state = .queued
        queued.attempts = .max
        let started = try queued.applying(.attemptStarted, now: 1).get()
        #expect(started.state == .running && started.attempts == .max)
        var running = Self.task(.raw)
        running.state = .running
        running.attempts = .min
        #expect(try running.applying(.requeued(counted: false), now: 1).get().attempts == 0)
        running.attempts = 3
        #expect(try running.applying(.requeued(counted: false), now: 1).get().attempts == 2)
        let interrupted = try started.applying(
            .attemptEnded(attempt: .max, bytesTransferred: 0, .interrupted), now: 2
        ).get()
        #expect(interrupted.state == .queued && interrupted.attempts == .max - 1)
        // The attempt a checkpoint names is never below zero (the engine subtracts it).
        let stored = TransferCheckpoint(try JSON.parse(#"{"offset": 0, "attempt": -9223372036854775808}"#))
        #expect(stored?.attempt == 0)
    }

    @Test("download: a size below zero, stored or answered, is no size (the engine subtracts the offset from it)")
    func downloadNegativeSizes() {
        var download = Self.task(.raw)
        download.kind = .download
        download.download = DownloadSpec(destination: "/d/file.bin")
        var stored = TransferCheckpoint(offset: 100, attempt: 1)
        stored.validator = "etag:\"v1\""
        stored.total = .min
        var machine = DownloadMachine(task: download, headers: [], checkpoint: stored)
        _ = machine.start(now: 0)
        let unsized = ResponseHead(status: 206, headers: ["etag": "\"v1\"", "content-range": "bytes 100-199/*"])
        #expect(machine.didReceiveHead(unsized) == .write(offset: 100, total: nil))

        machine = DownloadMachine(task: download, headers: [], checkpoint: stored)
        _ = machine.start(now: 0)
        let negative = ResponseHead(
            status: 206, headers: ["etag": "\"v1\"", "content-range": "bytes 100-199/-9223372036854775808"])
        #expect(machine.didReceiveHead(negative) == .discard)

        machine = DownloadMachine(task: download, headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        #expect(
            machine.didReceiveHead(ResponseHead(status: 200, headers: ["content-length": "-5"]))
                == .write(offset: 0, total: nil))
    }

    @Test("the code table has -3100 internal_error, and the engine's faults count it")
    func table() {
        #expect(TaskError.Kind(rawValue: -3100)?.name == "internal_error")
        #expect(EngineMetrics.Fault(rawValue: "internal_error") != nil)
    }
}
