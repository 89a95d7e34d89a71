import BackhaulTesting
import Foundation
import Glibc
import JSONCodec
import Testing

/// Fast retries for tests; the real schedule is table-tested.
let fastWebhookRetries = ["--webhook-retry-schedule", Array(repeating: "0.3", count: 40).joined(separator: ",")]

extension Fixture {
    /// Subscribes `receiver` (by URL) with the given secret, or a generated one; returns the subscription.
    func subscribe(_ url: String, secret: String? = nil, events: [String]? = nil, session: String = "s1") throws -> JSON {
        var body: JSONObject = ["url": .string(url)]
        if let secret { body["secret"] = .string(secret) }
        if let events { body["events"] = .array(events.map { .string($0) }) }
        let (status, webhook) = try daemon.call("POST", "/v1/sessions/\(session)/webhooks", .object(body))
        try #require(status == 201, "subscribe: \(webhook.serialized())")
        return webhook
    }
}

extension EndToEndTests {
    @Test("final events arrive signed (verified by standardwebhooks), session.drained once after the last")
    func webhooksArriveVerified() throws {
        let fixture = try Fixture(daemonArguments: fastWebhookRetries)
        try fixture.session()
        // A generated secret is shown once, at creation.
        let receiver = try WebhookReceiver(
            directory: fixture.scratch.path, secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], start: false)
        let webhook = try fixture.subscribe(receiver.url)
        let secret = try #require(webhook["secret"]?.stringValue)
        #expect(secret.hasPrefix("whsec_"))
        #expect(try fixture.daemon.call("GET", "/v1/webhooks/\(webhook["id"]!.stringValue!)").1["secret"] == nil)
        let verified = try WebhookReceiver(directory: fixture.scratch.path, secrets: [secret])
        _ = try fixture.daemon.call("PATCH", "/v1/webhooks/\(webhook["id"]!.stringValue!)", ["url": .string(verified.url)])

        // One batch: one completes, one fails (nothing listens on port 9), one waits until cancelled.
        let (status, batch) = try fixture.daemon.call(
            "POST", "/v1/sessions/s1/tasks",
            [
                "tasks": [
                    [
                        "file": .string(fixture.makeFile("a.bin", size: 1000)),
                        "request": ["url": .string(fixture.sink.url("/a"))],
                    ],
                    [
                        "file": .string(fixture.makeFile("b.bin", size: 1000)), "request": ["url": "http://127.0.0.1:9/b"],
                        "configuration": ["retry": ["max_attempts": 1]],
                    ],
                    [
                        "file": .string(fixture.makeFile("c.bin", size: 1000)),
                        "request": ["url": .string(fixture.sink.url("/c"))],
                        "earliest_begin_at": "2099-01-01T00:00:00Z",
                    ],
                ]
            ])
        try #require(status == 201)
        let ids = try #require(batch["tasks"]?.arrayValue).compactMap { $0["id"]?.stringValue }
        let (completed, failed, cancelled) = (ids[0], ids[1], ids[2])
        try fixture.daemon.waitForTask(completed)
        #expect(try fixture.daemon.waitForTask(failed)["error"]?["code"]?.intValue == -1004)
        Thread.sleep(forTimeInterval: 0.3)
        _ = try fixture.daemon.call("POST", "/v1/tasks/\(cancelled)/cancel")

        let arrived = eventually(timeout: 20) { verified.accepted.contains { $0["type"]?.stringValue == "session.drained" } }
        fixture.expectLog(arrived, "deliveries: \(verified.deliveries.map { $0.serialized() })")
        let accepted = verified.accepted
        #expect(verified.deliveries.allSatisfy { $0["verified_with"]?.arrayValue == [0] }, "every signature verifies")
        #expect(accepted.first { $0["task_id"]?.stringValue == completed }?["type"]?.stringValue == "task.completed")
        #expect(accepted.first { $0["task_id"]?.stringValue == failed }?["type"]?.stringValue == "task.failed")
        #expect(accepted.contains { $0["task_id"]?.stringValue == cancelled && $0["type"]?.stringValue == "task.cancelled" })
        // The cancelled task was `waiting` (scheduled) first.
        #expect(accepted.contains { $0["task_id"]?.stringValue == cancelled && $0["type"]?.stringValue == "task.waiting" })
        Thread.sleep(forTimeInterval: 0.5)
        let drained = verified.accepted.filter { $0["type"]?.stringValue == "session.drained" }
        #expect(drained.count == 1)
        #expect(verified.accepted.last?["type"]?.stringValue == "session.drained")
    }

    @Test("a receiver that fails the first deliveries gets them again with the same webhook-id")
    func webhookRetries() throws {
        let fixture = try Fixture(daemonArguments: fastWebhookRetries)
        try fixture.session()
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        let receiver = try WebhookReceiver(directory: fixture.scratch.path, secrets: [secret], failFirst: 2)
        let webhook = try fixture.subscribe(receiver.url, secret: secret, events: ["task.completed"])
        let id = try fixture.enqueue(fixture.makeFile("a.bin", size: 1000))
        #expect(eventually(timeout: 15) { receiver.accepted.count == 1 })
        let received = receiver.deliveries
        #expect(received.map { $0["status"]?.intValue } == [500, 500, 204])
        #expect(Set(received.compactMap { $0["webhook_id"]?.stringValue }).count == 1)
        #expect(received.allSatisfy { $0["task_id"]?.stringValue == id })
        let (_, page) = try fixture.daemon.call("GET", "/v1/webhooks/\(webhook["id"]!.stringValue!)/deliveries")
        let delivery = try #require(page["deliveries"]?.arrayValue?.first)
        #expect(delivery["state"]?.stringValue == "delivered")
        #expect(delivery["attempts"]?.intValue == 3)
        #expect(delivery["attempt_history"]?.arrayValue?.map { $0["status"]?.intValue } == [500, 500, 204])
        #expect(delivery["event_id"]?.stringValue == received.first?["webhook_id"]?.stringValue)
    }

    @Test("consumer down while the daemon is SIGKILLed and restarted: every final event arrives, duplicates only by webhook-id")
    func webhooksSurviveOutageAndCrash() throws {
        let fixture = try Fixture(daemonArguments: fastWebhookRetries)
        try fixture.session()
        let secret = WebhookRecordSecret.fixed
        let receiver = try WebhookReceiver(directory: fixture.scratch.path, secrets: [secret], start: false)
        _ = try fixture.subscribe(receiver.url, secret: secret, events: ["task.completed", "session.drained"])
        var ids: [String] = []
        for index in 0..<5 { ids.append(try fixture.enqueue(fixture.makeFile("f\(index)", size: 2000), path: "/f\(index)")) }
        for id in ids { try fixture.daemon.waitForTask(id) }
        Thread.sleep(forTimeInterval: 1)  // a few failed attempts against the closed port
        fixture.daemon.kill9()
        try fixture.daemon.start()
        try receiver.start()
        let all = eventually(timeout: 30) {
            Set(receiver.accepted.compactMap { $0["task_id"]?.stringValue }).isSuperset(of: ids)
                && receiver.accepted.contains { $0["type"]?.stringValue == "session.drained" }
        }
        fixture.expectLog(all, "accepted: \(receiver.accepted.map { $0.serialized() })")
        var idsByTask: [String: Set<String>] = [:]
        for delivery in receiver.accepted where delivery["type"]?.stringValue == "task.completed" {
            idsByTask[delivery["task_id"]!.stringValue!, default: []].insert(delivery["webhook_id"]!.stringValue!)
        }
        for id in ids { #expect(idsByTask[id]?.count == 1, "task \(id): one webhook-id however often delivered") }
    }

    @Test("410 Gone disables the subscription and abandons what is pending")
    func webhookGone() throws {
        let fixture = try Fixture(daemonArguments: fastWebhookRetries)
        try fixture.session()
        let secret = WebhookRecordSecret.fixed
        let receiver = try WebhookReceiver(directory: fixture.scratch.path, secrets: [secret], status: 410)
        let webhook = try fixture.subscribe(receiver.url, secret: secret, events: ["task.completed"])
        let webhookID = try #require(webhook["id"]?.stringValue)
        try fixture.daemon.waitForTask(try fixture.enqueue(fixture.makeFile("a.bin", size: 10)))
        #expect(
            eventually(timeout: 10) {
                (try? fixture.daemon.call("GET", "/v1/webhooks/\(webhookID)").1["enabled"]) == .bool(false)
            })
        let (_, current) = try fixture.daemon.call("GET", "/v1/webhooks/\(webhookID)")
        #expect(current["disabled_reason"]?.stringValue?.contains("410") == true)
        try fixture.daemon.waitForTask(try fixture.enqueue(fixture.makeFile("b.bin", size: 10), path: "/b"))
        Thread.sleep(forTimeInterval: 0.5)
        #expect(receiver.deliveries.count == 1, "nothing is sent to a disabled subscription")
        let (_, page) = try fixture.daemon.call("GET", "/v1/webhooks/\(webhookID)/deliveries")
        #expect(page["deliveries"]?.arrayValue?.first?["state"]?.stringValue == "abandoned")
        // Enabled again by a client, it receives new events.
        #expect(try fixture.daemon.call("PATCH", "/v1/webhooks/\(webhookID)", ["enabled": true]).1["enabled"] == .bool(true))
    }

    @Test("secret rotation: both signatures during the grace period")
    func webhookRotation() throws {
        let fixture = try Fixture(daemonArguments: fastWebhookRetries)
        try fixture.session()
        let old = WebhookRecordSecret.fixed
        let webhook = try fixture.subscribe("http://127.0.0.1:9/unused", secret: old, events: ["task.completed"])
        let (status, rotated) = try fixture.daemon.call(
            "POST", "/v1/webhooks/\(webhook["id"]!.stringValue!)/rotate", ["grace_seconds": 3600])
        #expect(status == 200)
        let new = try #require(rotated["secret"]?.stringValue)
        #expect(new != old)
        #expect(rotated["previous_secret_expires_at"]?.stringValue != nil)
        // The receiver knows only the old secret, then only the new one: both verify.
        let oldOnly = try WebhookReceiver(directory: fixture.scratch.path, secrets: [old])
        let newOnly = try WebhookReceiver(directory: fixture.scratch.path, secrets: [new])
        _ = try fixture.daemon.call("PATCH", "/v1/webhooks/\(webhook["id"]!.stringValue!)", ["url": .string(oldOnly.url)])
        try fixture.daemon.waitForTask(try fixture.enqueue(fixture.makeFile("a.bin", size: 10)))
        #expect(eventually(timeout: 10) { oldOnly.accepted.count == 1 })
        _ = try fixture.daemon.call("PATCH", "/v1/webhooks/\(webhook["id"]!.stringValue!)", ["url": .string(newOnly.url)])
        try fixture.daemon.waitForTask(try fixture.enqueue(fixture.makeFile("b.bin", size: 10), path: "/b"))
        #expect(eventually(timeout: 10) { newOnly.accepted.count == 1 })
        #expect(oldOnly.accepted.first?["signature"]?.stringValue?.split(separator: " ").count == 2)
    }

    @Test("GET /v1/events streams live and resumes from Last-Event-ID without gaps")
    func serverSentEvents() throws {
        let fixture = try Fixture()
        try fixture.session()
        var ids: [String] = []
        for index in 0..<4 { ids.append(try fixture.enqueue(fixture.makeFile("e\(index)", size: 100), path: "/e\(index)")) }
        for id in ids { try fixture.daemon.waitForTask(id) }
        // The whole log, from the start.
        let all = SSE.read(fixture.daemon.url + "/v1/events?after=0", seconds: 1.5)
        // Every completion, each once; the session drains after the last (possibly also between,
        // when a task finished before the next was enqueued).
        #expect(
            all.filter { $0.type == "task.completed" }.compactMap { $0.data["data"]?["id"]?.stringValue }.sorted() == ids.sorted()
        )
        #expect(all.last?.type == "session.drained")
        let sequence = all.map(\.id)
        #expect(sequence == sequence.sorted() && Set(sequence).count == sequence.count)
        // Resume after the second event: exactly the rest, in order.
        let rest = SSE.read(fixture.daemon.url + "/v1/events", lastEventID: sequence[1], seconds: 1.5)
        #expect(rest.map(\.id) == Array(sequence.dropFirst(2)))
        // Live: a stream opened now sees the next event as it happens, and only the session asked for.
        try fixture.session("other")
        let live = SSE.Reader(fixture.daemon.url + "/v1/events?session=s1", seconds: 4)
        Thread.sleep(forTimeInterval: 0.5)
        _ = try fixture.enqueue(fixture.makeFile("other.bin", size: 10), session: "other")
        let newID = try fixture.enqueue(fixture.makeFile("live.bin", size: 100), path: "/live")
        try fixture.daemon.waitForTask(newID)
        let liveEvents = live.finish()
        #expect(liveEvents.contains { $0.type == "task.completed" && $0.data["data"]?["id"]?.stringValue == newID })
        #expect(liveEvents.allSatisfy { $0.data["data"]?["session_id"]?.stringValue == "s1" })
        #expect(!liveEvents.contains { $0.id <= sequence.last! })
    }
}

enum WebhookRecordSecret {
    static let fixed = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
}

/// Reads a Server-Sent Events stream with the curl CLI (an independent client).
enum SSE {
    struct Event {
        var id: Int64
        var type: String
        var data: JSON
    }

    final class Reader {
        let process = Process()
        let output = Pipe()

        init(_ url: String, lastEventID: Int64? = nil, seconds: Double) {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
            process.arguments =
                ["-sN", "--max-time", String(seconds)] + (lastEventID.map { ["-H", "Last-Event-ID: \($0)"] } ?? []) + [url]
            process.standardOutput = output
            try? process.run()
        }

        func finish() -> [Event] {
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return SSE.parse(String(decoding: data, as: UTF8.self))
        }
    }

    static func read(_ url: String, lastEventID: Int64? = nil, seconds: Double) -> [Event] {
        Reader(url, lastEventID: lastEventID, seconds: seconds).finish()
    }

    static func parse(_ text: String) -> [Event] {
        text.components(separatedBy: "\n\n").compactMap { block in
            var id: Int64?
            var type = "message"
            var data = ""
            for line in block.split(separator: "\n") {
                if line.hasPrefix("id: ") { id = Int64(line.dropFirst(4)) }
                if line.hasPrefix("event: ") { type = String(line.dropFirst(7)) }
                if line.hasPrefix("data: ") { data += line.dropFirst(6) }
            }
            guard let id else { return nil }
            return Event(id: id, type: type, data: (try? JSON.parse(data, maxDepth: 64)) ?? .null)
        }
    }
}
