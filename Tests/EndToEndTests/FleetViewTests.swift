import BackhaulTesting
import Foundation
import JSONCodec
import PostgreSQL
import Testing
import Threads

extension FleetTests {
    @Test(
        "the fleet reads as one: a node that runs nothing streams every node's events, answers for every task, shows the nodes; webhooks come once each, with the same id across a takeover"
    )
    func fleetReadsAsOne() throws {
        let nginx = try NginxServer(directory: scratch.file("nginx-view"))
        let lease = 2.0
        let runners = try ["r1", "r2"].map { try node($0, lease: lease) }
        // No shared root: this node runs only what it accepts itself, and here it accepts nothing.
        let viewer = try DaemonProcess(
            stateDirectory: scratch.file("state-viewer"), allowedRoot: shared,
            arguments: ["--state", database.url, "--node-id", "viewer", "--lease-seconds", "\(lease)"])
        try #require(try runners[0].call("PUT", "/v1/sessions/one", ["configuration": [:]]).0 == 201)
        let secret = "whsec_" + Data("fleet-view-secret-32-bytes-long!".utf8).base64EncodedString()
        let receiver = try WebhookReceiver(directory: scratch.path, secrets: [secret])
        let (hookStatus, hook) = try runners[1].call(
            "POST", "/v1/sessions/one/webhooks",
            ["url": .string(receiver.url), "events": ["task.completed", "session.drained"], "secret": .string(secret)])
        try #require(hookStatus == 201, "\(hook.serialized())")
        // The viewer's event stream, from the start, for the whole run.
        let curl = Process()
        curl.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        curl.arguments = ["-sN", "-m", "120", "\(viewer.url)/v1/events?session=one&after=0"]
        let streamFile = scratch.file("viewer-events.txt")
        _ = FileManager.default.createFile(atPath: streamFile, contents: nil)
        curl.standardOutput = FileHandle(forWritingAtPath: streamFile)
        try curl.run()
        defer { if curl.isRunning { curl.terminate() } }
        // 200 KB/s over the fleet: the work is still going when one runner is killed.
        try #require(try runners[0].call("PUT", "/v1/policy", ["bandwidth_limit": .int(200_000)]).0 == 200)
        let count = 300
        let tasks: [JSON] = (0..<count).map { index in
            let name = "v\(index).bin"
            scratch.makeFile("shared/\(name)", size: 2_000 + index * 37)
            return ["file": .string(shared + "/" + name), "request": ["url": .string(nginx.url("/view/\(name)"))]]
        }
        let (status, body) = try runners[0].call("POST", "/v1/sessions/one/tasks", ["tasks": .array(tasks)], timeout: 60)
        try #require(status == 201, "\(body.serialized().prefix(300))")
        let ids = body["tasks"]?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? []
        try #require(ids.count == count)
        // One takeover: r1 is killed mid-run, and started again after two leases.
        Thread.sleep(forTimeInterval: 1.5)
        runners[0].kill9()
        Thread.sleep(forTimeInterval: 2 * lease)
        try runners[0].start()
        let db = try PostgresConnection(database.url)
        let finished = eventually(timeout: 120, interval: 0.2) {
            (try? db.execute("SELECT count(*) FROM tasks WHERE state = 'completed'").int(0, 0)) == Int64(count)
        }
        if !finished {
            let rows = try db.execute(
                "SELECT state, coalesce(waiting_reason, ''), coalesce(lease_node, ''), count(*) FROM tasks GROUP BY 1, 2, 3")
            let states = (0..<rows.count).map {
                "\(rows.string($0, 0) ?? "") \(rows.string($0, 1) ?? "") \(rows.string($0, 2) ?? ""): \(rows.string($0, 3) ?? "")"
            }
            let problems = (runners + [viewer]).map { daemon in
                daemon.log(lastLines: 100_000).split(separator: "\n").filter {
                    $0.contains("\"level\":\"error\"") || $0.contains("\"level\":\"warning\"") || $0.contains("critical")
                }.suffix(12).joined(separator: "\n")
            }
            Issue.record("not every task completed: \(states)\n\(problems.joined(separator: "\n--\n"))")
            return
        }
        // The viewer sent nothing (it ran none of them), and answers for each as the runners do.
        let metrics = try viewer.callText("/metrics")
        let sent = metrics.split(separator: "\n").filter { $0.hasPrefix("backhaul_sent_bytes_total") }
        #expect(!sent.isEmpty && sent.allSatisfy { $0.hasSuffix(" 0") }, "the viewer sent: \(sent)")
        let notCompleted = try ids.filter { try viewer.task($0)["state"]?.stringValue != "completed" }
        #expect(notCompleted.isEmpty, "the viewer does not show these completed: \(notCompleted.prefix(10))")
        for id in ids.prefix(25) {
            let answers = try runners.map { try $0.task(id)["state"]?.stringValue ?? "" }
            #expect(answers == ["completed", "completed"], "\(id): \(answers)")
        }
        // Every task's completion reached the viewer's stream, though it ran none of them.
        let streamed = eventually(timeout: 20) {
            let text = (try? String(contentsOfFile: streamFile, encoding: .utf8)) ?? ""
            return text.contains("session.drained")
                && ids.allSatisfy { text.contains("\"id\":\"\($0)\"") }
        }
        #expect(streamed, "the viewer's stream lacks some tasks' events")
        // Webhooks: each task's completion accepted, one webhook-id per task; any duplicate is a
        // redelivery with the same id; session.drained after every completion.
        let accepted = eventually(timeout: 60) {
            Set(receiver.accepted.compactMap { $0["task_id"]?.stringValue }).count == count
                && receiver.accepted.contains { $0["type"]?.stringValue == "session.drained" }
        }
        #expect(accepted, "\(Set(receiver.accepted.compactMap { $0["task_id"]?.stringValue }).count) of \(count) delivered")
        var idsByTask: [String: Set<String>] = [:]
        for delivery in receiver.accepted where delivery["type"]?.stringValue == "task.completed" {
            if let task = delivery["task_id"]?.stringValue, let webhookID = delivery["webhook_id"]?.stringValue {
                idsByTask[task, default: []].insert(webhookID)
            }
        }
        #expect(idsByTask.values.allSatisfy { $0.count == 1 }, "a task's completion came under two webhook-ids")
        let completions = receiver.accepted.filter { $0["type"]?.stringValue == "task.completed" }
        let duplicates = completions.count - idsByTask.count
        let drainedAt = receiver.accepted.firstIndex { $0["type"]?.stringValue == "session.drained" } ?? -1
        let lastCompletion = receiver.accepted.lastIndex { $0["type"]?.stringValue == "task.completed" } ?? .max
        #expect(drainedAt > lastCompletion, "session.drained came before a completion")
        // The fleet's list, on every node, and the dashboard's card on the viewer.
        for daemon in [viewer] + runners {
            let listed = try daemon.call("GET", "/v1/nodes").1["nodes"]?.arrayValue?.compactMap { $0["id"]?.stringValue }
            #expect(listed == ["r1", "r2", "viewer"])
        }
        // A network override is the node's own: the viewer's does not move the runners'.
        #expect(try viewer.call("PUT", "/v1/network", ["type": "cellular"]).0 == 200)
        #expect(try viewer.call("GET", "/v1/network").1["source"]?.stringValue == "override")
        Thread.sleep(forTimeInterval: 0.5)
        #expect(try runners[1].call("GET", "/v1/network").1["source"]?.stringValue != "override")
        let page = try BrowserRun("nodes", viewer.url + "/", ["--nodes", "r1,r2,viewer"])
        #expect(page.status == 0, "browser: \(page.output)")
        print(
            "fleet view: \(count) tasks, \(completions.count) completion deliveries (\(duplicates) redelivered), "
                + "the viewer's stream held all \(count)")
    }
}
