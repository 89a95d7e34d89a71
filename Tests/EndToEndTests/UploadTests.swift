import BackhaulTesting
import Curl
import Foundation
import Glibc
import JSONCodec
import Testing

/// The real daemon against the recording sink: every test starts its own process.
@Suite("End to end", .serialized)
struct EndToEndTests {
    @Test("a raw upload arrives byte-exact, with its final response captured")
    func rawUpload() throws {
        let fixture = try Fixture()
        try fixture.session()
        let file = fixture.makeFile("clip.bin", size: 3 * 1024 * 1024 + 17)
        let id = try fixture.enqueue(
            file,
            extra: [
                "request": [
                    "url": .string(fixture.sink.url("/clips/1")), "method": "PUT",
                    "headers": ["Authorization": "Bearer s3cr3t", "X-Trace": "abc"],
                ]
            ])
        let task = try fixture.daemon.waitForTask(id)
        fixture.expectLog(task["state"]?.stringValue == "completed", "state: \(task.serialized())")
        let request = try #require(fixture.sink.requests.last)
        #expect(request.method == "PUT")
        #expect(request.path == "/clips/1")
        #expect(request.headers["authorization"] == "Bearer s3cr3t")
        #expect(request.headers["content-length"] == "\(3 * 1024 * 1024 + 17)")
        #expect(Bytes(request.body) == Bytes(fixture.contents(file)))
        #expect(task["response"]?["status"]?.intValue == 201)
        #expect(task["response"]?["body"]?.stringValue == "{\"ok\":true}")
        #expect(task["progress"]?["fraction"]?.doubleValue == 1)
        #expect(task["attempts"]?.intValue == 1)
        // Secrets never leave the service.
        #expect(task["request"]?["headers"]?["Authorization"]?.stringValue == "[redacted]")
        #expect(task["request"]?["headers"]?["X-Trace"]?.stringValue == "abc")
        #expect(!fixture.daemon.log(lastLines: 10_000).contains("s3cr3t"))
    }

    @Test("a body under 1 MiB goes without waiting for 100 Continue; a larger one asks for it")
    func expectContinueBySize() throws {
        let fixture = try Fixture()
        try fixture.session()
        let small = try fixture.enqueue(fixture.makeFile("small.bin", size: (1 << 20) - 1), path: "/small")
        let large = try fixture.enqueue(fixture.makeFile("large.bin", size: 1 << 20), path: "/large")
        for id in [small, large] { #expect(try fixture.daemon.waitForTask(id)["state"]?.stringValue == "completed") }
        let expect = { (path: String) in fixture.sink.requests.first { $0.path == path }?.headers["expect"] }
        #expect(expect("/small") == nil)
        #expect(expect("/large") == "100-continue")
    }

    @Test("a multipart upload streams the file with its extra fields")
    func multipartUpload() throws {
        let fixture = try Fixture()
        try fixture.session()
        let file = fixture.makeFile("log.txt", size: 300_000)
        let id = try fixture.enqueue(
            file,
            extra: [
                "request": ["url": .string(fixture.sink.url("/forms")), "method": "POST"],
                "upload": [
                    "protocol": "multipart", "field": "attachment", "filename": "device.log", "content_type": "text/plain",
                    "fields": ["device": "cam-3", "kind": "log"],
                ],
            ])
        let task = try fixture.daemon.waitForTask(id)
        fixture.expectLog(task["state"]?.stringValue == "completed", "state: \(task.serialized())")
        let request = try #require(fixture.sink.requests.last)
        #expect(request.method == "POST")
        let contentType = try #require(request.headers["content-type"])
        let boundary = try #require(contentType.components(separatedBy: "boundary=").last)
        let parts = Multipart.parse(request.body, boundary: boundary)
        #expect(parts.count == 3)
        #expect(parts.first { $0.name == "device" }?.body == Data("cam-3".utf8))
        #expect(parts.first { $0.name == "kind" }?.body == Data("log".utf8))
        let filePart = try #require(parts.first { $0.name == "attachment" })
        #expect(filePart.filename == "device.log")
        #expect(filePart.contentType == "text/plain")
        #expect(Bytes(filePart.body) == Bytes(fixture.contents(file)))
    }

    @Test("503, 503, 201 completes after three attempts")
    func retriesTransientStatuses() throws {
        let fixture = try Fixture()
        try fixture.session("s1", quickRetry)
        fixture.sink.enqueue(.respond(status: 503), .respond(status: 503), .respond(status: 201))
        let file = fixture.makeFile("a.bin", size: 100_000)
        let task = try fixture.daemon.waitForTask(try fixture.enqueue(file))
        fixture.expectLog(task["state"]?.stringValue == "completed", "state: \(task.serialized())")
        #expect(task["attempts"]?.intValue == 3)
        #expect(fixture.sink.requests.map(\.status) == [503, 503, 201])
        #expect(Bytes(fixture.sink.requests.last?.body) == Bytes(fixture.contents(file)))
        // Engine figures reach /metrics within a quarter of a second.
        let client = try HTTPClient()
        let counted = try eventually(timeout: 3) {
            let metrics = try client.send("GET", "http://127.0.0.1:\(fixture.daemon.port)/metrics")
            return try PrometheusParser.parse(String(decoding: metrics.body, as: UTF8.self))[
                "backhaul_retries_total{reason=http_5xx}"] == 2
        }
        #expect(counted, "retries are counted by kind")
    }

    @Test("Retry-After is honoured")
    func retryAfter() throws {
        let fixture = try Fixture()
        try fixture.session("s1", quickRetry)
        fixture.sink.enqueue(.respond(status: 429, headers: [("Retry-After", "2")]))
        let task = try fixture.daemon.waitForTask(try fixture.enqueue(fixture.makeFile("a.bin", size: 1000)))
        #expect(task["state"]?.stringValue == "completed")
        let requests = fixture.sink.requests
        try #require(requests.count == 2)
        #expect(requests[1].startedAt - (requests[0].endedAt ?? 0) >= 1.9)
    }

    @Test("a 404 fails the task with -1011 and the status")
    func notFoundFails() throws {
        let fixture = try Fixture()
        try fixture.session()
        fixture.sink.enqueue(.respond(status: 404, body: "no such bucket"))
        let task = try fixture.daemon.waitForTask(try fixture.enqueue(fixture.makeFile("a.bin", size: 1000)))
        #expect(task["state"]?.stringValue == "failed")
        #expect(task["error"]?["code"]?.intValue == -1011)
        #expect(task["error"]?["name"]?.stringValue == "bad_server_response")
        #expect(task["error"]?["http_status"]?.intValue == 404)
        #expect(task["response"]?["body"]?.stringValue == "no such bucket")
        #expect(task["attempts"]?.intValue == 1)
    }

    @Test("retries stop at max_attempts")
    func maxAttempts() throws {
        let fixture = try Fixture(sink: .respond(status: 500))
        try fixture.session("s1", ["retry": ["max_attempts": 2, "initial_backoff": 0.05, "max_backoff": 0.1]])
        let task = try fixture.daemon.waitForTask(try fixture.enqueue(fixture.makeFile("a.bin", size: 1000)))
        #expect(task["state"]?.stringValue == "failed")
        #expect(task["attempts"]?.intValue == 2)
        #expect(task["error"]?["http_status"]?.intValue == 500)
    }

    @Test("a dropped connection is retried and the second attempt is exact")
    func droppedConnection() throws {
        let fixture = try Fixture()
        try fixture.session("s1", quickRetry)
        fixture.sink.enqueue(.drop(afterBytes: 200_000))
        let file = fixture.makeFile("a.bin", size: 1_000_000)
        let task = try fixture.daemon.waitForTask(try fixture.enqueue(file))
        fixture.expectLog(task["state"]?.stringValue == "completed", "state: \(task.serialized())")
        #expect(task["attempts"]?.intValue == 2)
        #expect(Bytes(fixture.sink.requests.last?.body) == Bytes(fixture.contents(file)))
    }

    @Test("a stalled server hits the request timeout and the retry succeeds")
    func requestTimeout() throws {
        let fixture = try Fixture()
        try fixture.session("s1", ["timeout_interval_for_request": 1, "retry": ["initial_backoff": 0.05, "max_backoff": 0.1]])
        fixture.sink.enqueue(.stall(seconds: 4, status: 201))
        let started = Date()
        let task = try fixture.daemon.waitForTask(try fixture.enqueue(fixture.makeFile("a.bin", size: 1000)))
        fixture.expectLog(task["state"]?.stringValue == "completed", "state: \(task.serialized())")
        #expect(task["attempts"]?.intValue == 2)
        #expect(Date().timeIntervalSince(started) < 3.9)
    }

    @Test("the request timeout with no retries left fails -1001")
    func requestTimeoutExhausted() throws {
        let fixture = try Fixture(sink: .stall(seconds: 4, status: 201))
        try fixture.session("s1", ["timeout_interval_for_request": 1, "retry": ["max_attempts": 1]])
        let task = try fixture.daemon.waitForTask(try fixture.enqueue(fixture.makeFile("a.bin", size: 1000)))
        #expect(task["state"]?.stringValue == "failed")
        #expect(task["error"]?["code"]?.intValue == -1001)
        #expect(task["error"]?["name"]?.stringValue == "timed_out")
    }

    @Test("the resource timeout ends a task that cannot finish: -1001")
    func resourceTimeout() throws {
        let fixture = try Fixture(sink: .stall(seconds: 6, status: 201))
        try fixture.session("s1", ["timeout_interval_for_resource": 2])
        let started = Date()
        let task = try fixture.daemon.waitForTask(try fixture.enqueue(fixture.makeFile("a.bin", size: 1000)))
        #expect(task["state"]?.stringValue == "failed")
        #expect(task["error"]?["code"]?.intValue == -1001)
        let elapsed = Date().timeIntervalSince(started)
        #expect(elapsed >= 1.9 && elapsed < 4, "took \(elapsed) s")
    }

    @Test("a file modified during the upload fails -4001 file_changed")
    func fileChangedMidUpload() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 1_000_000, then: .respond(status: 201)))
        try fixture.session()
        let file = fixture.makeFile("grow.bin", size: 3_000_000)
        let id = try fixture.enqueue(file)
        try #require(eventually(timeout: 10) { (fixture.sink.requests.first?.bodyLength ?? 0) > 100_000 })
        let handle = try #require(FileHandle(forWritingAtPath: file))
        handle.seekToEndOfFile()
        handle.write(Data("appended".utf8))
        try handle.close()
        let task = try fixture.daemon.waitForTask(id)
        #expect(task["state"]?.stringValue == "failed")
        #expect(task["error"]?["code"]?.intValue == -4001)
        #expect(task["error"]?["name"]?.stringValue == "file_changed")
    }

    @Test("a file that vanished before its start fails -1100")
    func fileVanished() throws {
        let fixture = try Fixture()
        try fixture.session()
        let file = fixture.makeFile("gone.bin", size: 1000)
        let start = Date().addingTimeInterval(1.5).timeIntervalSince1970
        let id = try fixture.enqueue(file, extra: ["earliest_begin_at": .string(rfc3339(start))])
        let waiting = try fixture.daemon.task(id)
        #expect(waiting["state"]?.stringValue == "waiting")
        #expect(waiting["waiting_reason"]?.stringValue == "scheduled")
        try FileManager.default.removeItem(atPath: file)
        let task = try fixture.daemon.waitForTask(id)
        #expect(task["state"]?.stringValue == "failed")
        #expect(task["error"]?["code"]?.intValue == -1100)
        #expect(fixture.sink.requests.isEmpty)
    }

    @Test("200 tasks enqueued in one batch all complete, byte-exact")
    func batchOf200() throws {
        let fixture = try Fixture()
        try fixture.session()
        var files: [String] = []
        var tasks: [JSON] = []
        for index in 0..<200 {
            let file = fixture.makeFile("f\(index).bin", size: 1000 + index * 37)
            files.append(file)
            tasks.append(["file": .string(file), "request": ["url": .string(fixture.sink.url("/batch/\(index)"))]])
        }
        let (status, body) = try fixture.daemon.call("POST", "/v1/sessions/s1/tasks", ["tasks": .array(tasks)])
        try #require(status == 201)
        let ids = try #require(body["tasks"]?.arrayValue).compactMap { $0["id"]?.stringValue }
        #expect(ids.count == 200)
        let done = eventually(timeout: 60) {
            let (_, session) = (try? fixture.daemon.call("GET", "/v1/sessions/s1")) ?? (0, .null)
            return session["task_counts"]?["completed"]?.intValue == 200
        }
        fixture.expectLog(done, "not all 200 completed")
        var byPath: [String: Data] = [:]
        for request in fixture.sink.requests { byPath[request.path] = request.body }
        for (index, file) in files.enumerated() {
            #expect(Bytes(byPath["/batch/\(index)"]) == Bytes(fixture.contents(file)), "file \(index)")
        }
    }

    @Test("higher priority runs first")
    func priorityOrder() throws {
        let fixture = try Fixture(daemonArguments: ["--max-transfers", "1"])
        try fixture.session()
        // Hold the single slot while the others are enqueued.
        fixture.sink.enqueue(.stall(seconds: 1, status: 201))
        let blocker = try fixture.enqueue(fixture.makeFile("blocker", size: 10), path: "/blocker")
        try #require(eventually(timeout: 5) { fixture.sink.requests.count == 1 })
        for (name, priority) in [("low", 0.1), ("high", 0.9), ("mid", 0.5)] {
            _ = try fixture.enqueue(fixture.makeFile(name, size: 10), path: "/\(name)", extra: ["priority": .double(priority)])
        }
        try fixture.daemon.waitForTask(blocker)
        #expect(eventually(timeout: 10) { fixture.sink.requests.count == 4 })
        #expect(fixture.sink.requests.map(\.path) == ["/blocker", "/high", "/mid", "/low"])
    }

    @Test("max_connections_per_host bounds concurrent transfers to one host")
    func perHostLimit() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 400_000, then: .respond(status: 201)))
        try fixture.session("s1", ["max_connections_per_host": 2])
        var ids: [String] = []
        for index in 0..<6 { ids.append(try fixture.enqueue(fixture.makeFile("h\(index)", size: 200_000), path: "/h/\(index)")) }
        var sawHeld = false
        _ = eventually(timeout: 5) {
            let (_, page) = (try? fixture.daemon.call("GET", "/v1/sessions/s1/tasks?state=queued")) ?? (0, .null)
            sawHeld =
                page["tasks"]?.arrayValue?.contains { $0["waiting_reason"]?.stringValue == "host_connection_limit" } ?? false
            return sawHeld
        }
        for id in ids { try fixture.daemon.waitForTask(id) }
        #expect(fixture.sink.maxConcurrentRequests == 2)
        #expect(sawHeld)
        #expect(fixture.sink.requests.count == 6)
    }

    @Test("cancel stops a running upload; suspend and resume restart it")
    func cancelSuspendResume() throws {
        // Larger than the loopback socket buffers, which take a few MB at once: otherwise the whole
        // body could already be on its way when the cancel comes.
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 4_000_000, then: .respond(status: 201)))
        try fixture.session()
        let file = fixture.makeFile("big.bin", size: 32_000_000)
        let cancelled = try fixture.enqueue(file, path: "/c")
        try fixture.daemon.waitForTask(cancelled, state: "running")
        let (status, body) = try fixture.daemon.call("POST", "/v1/tasks/\(cancelled)/cancel")
        #expect(status == 200)
        #expect(body["state"]?.stringValue == "cancelled")
        #expect(body["cancellation"]?["reason_code"]?.intValue == 0)
        #expect(body["cancellation"]?["reason"]?.stringValue == "user_cancelled")
        #expect(body["error"]?["code"]?.intValue == -999)
        #expect(eventually(timeout: 10) { fixture.sink.requests.first.map { $0.endedAt != nil } ?? false })
        #expect(fixture.sink.requests.first?.answered == false)
        #expect((fixture.sink.requests.first?.bodyLength ?? 0) < 32_000_000)
        // A cancelled task cannot be resumed.
        #expect(try fixture.daemon.call("POST", "/v1/tasks/\(cancelled)/resume").0 == 409)

        fixture.sink.setFallback(.respond(status: 201))
        let small = fixture.makeFile("small.bin", size: 1000)
        fixture.sink.enqueue(.stall(seconds: 2, status: 201))
        let suspended = try fixture.enqueue(small, path: "/s")
        try fixture.daemon.waitForTask(suspended, state: "running")
        #expect(try fixture.daemon.call("POST", "/v1/tasks/\(suspended)/suspend").1["state"]?.stringValue == "suspended")
        Thread.sleep(forTimeInterval: 0.3)
        #expect(try fixture.daemon.task(suspended)["state"]?.stringValue == "suspended")
        #expect(try fixture.daemon.call("POST", "/v1/tasks/\(suspended)/resume").1["state"]?.stringValue == "queued")
        let task = try fixture.daemon.waitForTask(suspended)
        #expect(task["state"]?.stringValue == "completed")
        #expect(Bytes(fixture.sink.requests.last?.body) == Bytes(fixture.contents(small)))
    }

    /// A new task starts from the copy the engine kept at its creation; a PATCH while it waits in
    /// the queue must reach the request all the same.
    @Test("new headers PATCHed on a task waiting in the queue are the ones it sends")
    func headersPatchedWhileQueued() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 128 * 1024, then: .respond(status: 201)))
        try fixture.session("s1", ["max_connections_per_host": 1])
        let first = try fixture.enqueue(fixture.makeFile("first.bin", size: 512 * 1024), path: "/first")
        try fixture.daemon.waitForTask(first, state: "running")
        let waiting = try fixture.enqueue(
            fixture.makeFile("second.bin", size: 1000), path: "/second",
            extra: ["request": ["url": .string(fixture.sink.url("/second")), "headers": ["Authorization": "Bearer old"]]])
        #expect(try fixture.daemon.task(waiting)["state"]?.stringValue == "queued")
        let (status, _) = try fixture.daemon.call(
            "PATCH", "/v1/tasks/\(waiting)", ["request": ["headers": ["Authorization": "Bearer new"]]])
        #expect(status == 200)
        #expect(try fixture.daemon.task(first)["state"]?.stringValue == "running", "the first still held the host's slot")
        #expect(try fixture.daemon.waitForTask(waiting)["state"]?.stringValue == "completed")
        let sent = fixture.sink.requests.filter { $0.path == "/second" }
        #expect(sent.count == 1 && sent.first?.headers["authorization"] == "Bearer new")
    }

    @Test("a 401 holds the task in auth_required until new headers come")
    func authenticationRequired() throws {
        let fixture = try Fixture()
        try fixture.session()
        fixture.sink.enqueue(.respond(status: 401))
        let id = try fixture.enqueue(
            fixture.makeFile("a.bin", size: 1000),
            extra: ["request": ["url": .string(fixture.sink.url("/auth")), "headers": ["Authorization": "Bearer old"]]])
        let held = try fixture.daemon.waitForTask(id, state: "auth_required")
        #expect(held["state"]?.stringValue == "auth_required")
        let (status, patched) = try fixture.daemon.call(
            "PATCH", "/v1/tasks/\(id)", ["request": ["headers": ["Authorization": "Bearer new"]]])
        #expect(status == 200)
        #expect(patched["state"]?.stringValue == "queued" || patched["state"]?.stringValue == "running")
        let task = try fixture.daemon.waitForTask(id)
        #expect(task["state"]?.stringValue == "completed")
        #expect(fixture.sink.requests.last?.headers["authorization"] == "Bearer new")
    }
}

func rfc3339(_ time: Double) -> String {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    return formatter.string(from: Date(timeIntervalSince1970: time))
}

/// A minimal multipart/form-data reader for checking what the sink received.
enum Multipart {
    struct Part {
        var name: String?
        var filename: String?
        var contentType: String?
        var body: Data
    }

    static func parse(_ data: Data, boundary: String) -> [Part] {
        let delimiter = Data("--\(boundary)".utf8)
        var parts: [Part] = []
        var ranges: [Range<Data.Index>] = []
        var searchStart = data.startIndex
        while let range = data.range(of: delimiter, in: searchStart..<data.endIndex) {
            ranges.append(range)
            searchStart = range.upperBound
        }
        for (current, next) in zip(ranges, ranges.dropFirst()) {
            let chunk = data[current.upperBound..<next.lowerBound]
            guard let split = chunk.range(of: Data("\r\n\r\n".utf8)) else { continue }
            let head = String(decoding: chunk[chunk.startIndex..<split.lowerBound], as: UTF8.self)
            var body = chunk[split.upperBound..<chunk.endIndex]
            if body.suffix(2) == Data("\r\n".utf8) { body = body.dropLast(2) }
            var part = Part(body: Data(body))
            for line in head.components(separatedBy: "\r\n") {
                let lower = line.lowercased()
                if lower.hasPrefix("content-disposition:") {
                    part.name = value(of: "name", in: line)
                    part.filename = value(of: "filename", in: line)
                } else if lower.hasPrefix("content-type:") {
                    part.contentType = line.dropFirst("content-type:".count).trimmingCharacters(in: .whitespaces)
                }
            }
            parts.append(part)
        }
        return parts
    }

    private static func value(of key: String, in line: String) -> String? {
        guard let range = line.range(of: " \(key)=\"") ?? line.range(of: ";\(key)=\"") else { return nil }
        let rest = line[range.upperBound...]
        return rest.firstIndex(of: "\"").map { String(rest[..<$0]) }
    }
}
