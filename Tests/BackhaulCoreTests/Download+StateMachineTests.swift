import BackhaulCore
import Testing

@Suite("Download state machine")
struct DownloadStateMachineTests {
    let url = "http://h/file.bin"

    func task() -> TaskRecord {
        var task = TaskRecord(
            id: "t", sessionID: "s", file: FileInfo(path: "/d/file.bin", size: 0, modifiedAtNanoseconds: 0),
            request: RequestSpec(url: url, method: "GET"), upload: UploadSpec(), createdAt: 0, deadlineAt: 100)
        task.kind = .download
        task.download = DownloadSpec(destination: "/d/file.bin")
        return task
    }

    func checkpoint(offset: Int64, validator: String? = "etag:\"v1\"", total: Int64? = 1000) -> TransferCheckpoint {
        var checkpoint = TransferCheckpoint(offset: offset, attempt: 1)
        checkpoint.validator = validator
        checkpoint.total = total
        return checkpoint
    }

    func get(_ headers: [(String, String)] = []) -> TransferStep {
        .send(PlannedRequest(method: "GET", url: url, headers: headers, body: .empty))
    }

    let full = ResponseHead(status: 200, headers: ["etag": "\"v1\"", "content-length": "1000"])

    @Test("a fresh download: a plain GET, the body written from 0, complete when the size is reached")
    func fresh() {
        var machine = DownloadMachine(task: task(), headers: [("Accept", "*/*")], checkpoint: nil)
        #expect(machine.start(now: 0) == get([("Accept", "*/*")]))
        #expect(machine.didReceiveHead(full) == .write(offset: 0, total: 1000))
        machine.didWrite(1000)
        #expect(machine.didReceive(full, now: 0) == .completed)
        #expect(machine.bytesAcknowledged == 1000)
        #expect(machine.checkpoint?.validator == "etag:\"v1\"")
    }

    @Test("the checkpoint holds only what was made durable")
    func durability() {
        var machine = DownloadMachine(task: task(), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        _ = machine.didReceiveHead(full)
        #expect(machine.checkpoint?.offset == 0)
        machine.didPersist(offset: 600, attempt: 2)
        #expect(machine.checkpoint?.offset == 600)
        #expect(machine.checkpoint?.attempt == 2)
    }

    @Test("a short body fails the attempt as a lost connection; the durable part is kept for the next")
    func shortBody() {
        var machine = DownloadMachine(task: task(), headers: [], checkpoint: nil)
        _ = machine.start(now: 0)
        _ = machine.didReceiveHead(full)
        machine.didPersist(offset: 400, attempt: 1)
        machine.didWrite(400)
        guard case .failed(.transport(.connectionLost, _)) = machine.didReceive(full, now: 0) else {
            Issue.record("expected a lost connection")
            return
        }
        #expect(machine.checkpoint?.offset == 400)
    }

    @Test("resuming sends Range and If-Range; a matching 206 is written at the offset")
    func resume() {
        var machine = DownloadMachine(
            task: task(), headers: [("Range", "bytes=5-"), ("X", "y")], checkpoint: checkpoint(offset: 600))
        #expect(machine.start(now: 0) == get([("X", "y"), ("Range", "bytes=600-"), ("If-Range", "\"v1\"")]))
        let partial = ResponseHead(status: 206, headers: ["etag": "\"v1\"", "content-range": "bytes 600-999/1000"])
        #expect(machine.didReceiveHead(partial) == .write(offset: 600, total: 1000))
        machine.didWrite(400)
        #expect(machine.didReceive(partial, now: 0) == .completed)
        #expect(machine.bytesAcknowledged == 1000)
    }

    @Test("Last-Modified is the validator when there is no strong ETag")
    func lastModified() {
        var machine = DownloadMachine(
            task: task(), headers: [], checkpoint: checkpoint(offset: 10, validator: "date:Sun, 22 Nov 2026 10:00:00 GMT"))
        #expect(machine.start(now: 0) == get([("Range", "bytes=10-"), ("If-Range", "Sun, 22 Nov 2026 10:00:00 GMT")]))
        var fresh = DownloadMachine(task: task(), headers: [], checkpoint: nil)
        _ = fresh.start(now: 0)
        _ = fresh.didReceiveHead(
            ResponseHead(status: 200, headers: ["etag": "W/\"weak\"", "last-modified": "Mon, 1 Jan 2026 00:00:00 GMT"]))
        #expect(fresh.checkpoint?.validator == "date:Mon, 1 Jan 2026 00:00:00 GMT")
    }

    @Test("without a validator a saved offset cannot be trusted: the download starts over")
    func noValidator() {
        var machine = DownloadMachine(task: task(), headers: [], checkpoint: checkpoint(offset: 600, validator: nil))
        #expect(machine.start(now: 0) == get())
        #expect(machine.checkpoint?.offset == 0)
    }

    /// What a ranged request's answer makes the machine do with the body.
    @Test(
        "answers to a ranged request",
        arguments: [
            // The server ignores ranges, or If-Range found a changed file: the whole file from 0.
            (
                ResponseHead(status: 200, headers: ["etag": "\"v2\"", "content-length": "900"]),
                ResponseBodyTarget.write(offset: 0, total: 900)
            ),
            // A 206 that does not start at the offset, or carries another ETag: start over.
            (ResponseHead(status: 206, headers: ["etag": "\"v1\"", "content-range": "bytes 0-999/1000"]), .discard),
            (ResponseHead(status: 206, headers: ["etag": "\"v2\"", "content-range": "bytes 600-999/1000"]), .discard),
            // A 206 without Content-Range is not usable.
            (ResponseHead(status: 206, headers: ["etag": "\"v1\""]), .discard),
            // Errors are not written.
            (ResponseHead(status: 503), .discard),
            (ResponseHead(status: 416, headers: ["content-range": "bytes */1000"]), .discard),
        ])
    func rangedAnswers(head: ResponseHead, expected: ResponseBodyTarget) {
        var machine = DownloadMachine(task: task(), headers: [], checkpoint: checkpoint(offset: 600))
        _ = machine.start(now: 0)
        #expect(machine.didReceiveHead(head) == expected)
    }

    @Test("a changed representation restarts the attempt with a plain GET, at most three times")
    func restart() {
        var machine = DownloadMachine(task: task(), headers: [], checkpoint: checkpoint(offset: 600))
        _ = machine.start(now: 0)
        let changed = ResponseHead(status: 206, headers: ["etag": "\"v2\"", "content-range": "bytes 600-999/1000"])
        for _ in 0..<DownloadMachine.maxRestarts {
            #expect(machine.didReceiveHead(changed) == .discard)
            #expect(machine.didReceive(changed, now: 0) == get())
            #expect(machine.checkpoint?.offset == 0)
            #expect(machine.checkpoint?.validator == nil)
        }
        // A fresh GET answered 206 from 0 is taken as the whole file.
        let fromZero = ResponseHead(status: 206, headers: ["etag": "\"v3\"", "content-range": "bytes 0-999/1000"])
        #expect(machine.didReceiveHead(fromZero) == .write(offset: 0, total: 1000))
    }

    @Test("a 416 at the known size completes (everything was there); a 503 goes to the retry policy")
    func edges() {
        var complete = DownloadMachine(task: task(), headers: [], checkpoint: checkpoint(offset: 1000))
        _ = complete.start(now: 0)
        let satisfied = ResponseHead(status: 416, headers: ["content-range": "bytes */1000"])
        #expect(complete.didReceiveHead(satisfied) == .discard)
        #expect(complete.didReceive(satisfied, now: 0) == .completed)

        var busy = DownloadMachine(task: task(), headers: [], checkpoint: nil)
        _ = busy.start(now: 0)
        let unavailable = ResponseHead(status: 503, headers: ["retry-after": "7"])
        #expect(busy.didReceiveHead(unavailable) == .discard)
        #expect(busy.didReceive(unavailable, now: 0) == .failed(.http(status: 503, retryAfter: 7)))
    }
}
