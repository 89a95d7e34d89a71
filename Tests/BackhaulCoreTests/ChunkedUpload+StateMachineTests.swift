import BackhaulCore
import Testing

@Suite("Chunked upload state machine")
struct ChunkedUploadStateMachineTests {
    func task(size: Int64 = 2500, chunk: Int64 = 1000) -> TaskRecord {
        var upload = UploadSpec(protocolName: .chunked)
        upload.chunkSize = chunk
        return TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/d/f", size: size, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: "http://h/u", method: "PUT"), upload: upload, createdAt: 0, deadlineAt: 100)
    }

    func chunk(_ first: Int64, _ last: Int64, of total: Int64) -> TransferStep {
        .send(
            PlannedRequest(
                method: "PUT", url: "http://h/u", headers: [("Content-Range", "bytes \(first)-\(last)/\(total)")],
                body: .file(offset: first, length: last - first + 1)))
    }

    @Test("chunks in order; 308 and 2xx advance; the last 2xx completes")
    func happyPath() {
        var machine = ChunkedUpload(task: task(), headers: [], checkpoint: nil)
        #expect(machine.start(now: 0) == chunk(0, 999, of: 2500))
        #expect(
            machine.didReceive(ResponseHead(status: 308, headers: ["range": "bytes=0-999"]), now: 0)
                == chunk(1000, 1999, of: 2500))
        #expect(machine.bytesAcknowledged == 1000)
        #expect(machine.didReceive(ResponseHead(status: 200), now: 0) == chunk(2000, 2499, of: 2500))
        #expect(machine.didReceive(ResponseHead(status: 201), now: 0) == .completed)
        #expect(machine.bytesAcknowledged == 2500)
    }

    /// Found by the fuzz target `chunked`: a status query answered `308` with `Range: bytes=0-3499`
    /// for a file of 2500 bytes showed 3500 bytes acknowledged, and checkpointed them.
    @Test("a 308 whose Range passes the file fails the attempt and counts nothing past the file")
    func rangePastTheFile() {
        var queried = ChunkedUpload(task: task(), headers: [], checkpoint: TransferCheckpoint(offset: 1000))
        _ = queried.start(now: 0)
        guard case .failed(.fatal) = queried.didReceive(ResponseHead(status: 308, headers: ["range": "bytes=0-3499"]), now: 0)
        else {
            Issue.record("a Range past the file must fail the attempt")
            return
        }
        #expect(queried.bytesAcknowledged == 1000 && queried.checkpoint?.offset == 1000)
        var sent = ChunkedUpload(task: task(), headers: [], checkpoint: nil)
        _ = sent.start(now: 0)
        guard case .failed(.fatal) = sent.didReceive(ResponseHead(status: 308, headers: ["range": "bytes=0-3499"]), now: 0)
        else {
            Issue.record("a Range past the file must fail the attempt")
            return
        }
        #expect(sent.bytesAcknowledged == 0)
    }

    @Test("a 308 with a shorter Range makes it resend from the server's offset")
    func serverRange() {
        var machine = ChunkedUpload(task: task(), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        #expect(
            machine.didReceive(ResponseHead(status: 308, headers: ["range": "bytes=0-499"]), now: 0) == chunk(500, 1499, of: 2500)
        )
    }

    @Test("a failed chunk fails the attempt; the next attempt resumes at the acknowledged offset")
    func failedChunk() {
        var machine = ChunkedUpload(task: task(), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        _ = machine.didReceive(ResponseHead(status: 308, headers: ["range": "bytes=0-999"]), now: 0)
        #expect(
            machine.didReceive(ResponseHead(status: 503, headers: ["retry-after": "3"]), now: 0)
                == .failed(.http(status: 503, retryAfter: 3)))
        #expect(machine.bytesAcknowledged == 1000)
        // Resuming asks the server first.
        var resumed = ChunkedUpload(task: task(), headers: [], checkpoint: TransferCheckpoint(offset: machine.bytesAcknowledged))
        #expect(
            resumed.start(now: 0)
                == .send(
                    PlannedRequest(
                        method: "PUT", url: "http://h/u",
                        headers: [("Content-Range", "bytes */2500")], body: .file(offset: 0, length: 0))))
        #expect(
            resumed.didReceive(ResponseHead(status: 308, headers: ["range": "bytes=0-1499"]), now: 0)
                == chunk(1500, 2499, of: 2500))
    }

    @Test(
        "resume query answers",
        arguments: [
            (ResponseHead(status: 308, headers: [:]), chunk0: true), (ResponseHead(status: 400), chunk0: false),
            (ResponseHead(status: 416), chunk0: false),
        ])
    func resumeQuery(_ response: ResponseHead, _ fromZero: Bool) {
        var machine = ChunkedUpload(task: task(), headers: [], checkpoint: TransferCheckpoint(offset: 1000))
        _ = machine.start(now: 0)
        // 308 without Range: the server has nothing; a server that cannot answer: trust the local record.
        #expect(machine.didReceive(response, now: 0) == (fromZero ? chunk(0, 999, of: 2500) : chunk(1000, 1999, of: 2500)))
    }

    @Test("the resume query: complete already, or a transient error")
    func resumeQueryOutcomes() {
        var complete = ChunkedUpload(task: task(), headers: [], checkpoint: TransferCheckpoint(offset: 1000))
        _ = complete.start(now: 0)
        #expect(complete.didReceive(ResponseHead(status: 200), now: 0) == .completed)
        var busy = ChunkedUpload(task: task(), headers: [], checkpoint: TransferCheckpoint(offset: 1000))
        _ = busy.start(now: 0)
        #expect(busy.didReceive(ResponseHead(status: 503), now: 0) == .failed(.http(status: 503, retryAfter: nil)))
    }

    @Test("a 308 on the last chunk is a protocol violation; an empty file is one empty request")
    func edges() {
        var machine = ChunkedUpload(task: task(size: 500), headers: [], checkpoint: nil)
        #expect(machine.start(now: 0) == chunk(0, 499, of: 500))
        guard case .failed(.http(308, _, _, _)) = machine.didReceive(ResponseHead(status: 308), now: 0) else {
            Issue.record("a 308 to the last chunk must fail")
            return
        }
        var empty = ChunkedUpload(task: task(size: 0), headers: [], checkpoint: nil)
        #expect(
            empty.start(now: 0)
                == .send(PlannedRequest(method: "PUT", url: "http://h/u", headers: [], body: .file(offset: 0, length: 0))))
        #expect(empty.didReceive(ResponseHead(status: 201), now: 0) == .completed)
    }
}
