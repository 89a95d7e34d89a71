import BackhaulClient
import BackhaulTesting
import Foundation
import Testing
import Threads

/// A real daemon (the `backhauld` binary), a recording sink and a client pointed at them.
final class LiveDaemon {
    let scratch = TemporaryDirectory("backhaul-client")
    let data: String
    let sink: RecordingSink
    let daemon: DaemonProcess
    let client: BackhaulClient

    init(sink fallback: RecordingSink.Behaviour = .respond(status: 201, body: "{\"ok\":true}")) throws {
        data = scratch.file("data")
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        sink = try RecordingSink(directory: scratch.file("sink"), fallback: fallback)
        daemon = try DaemonProcess(stateDirectory: scratch.file("state"), allowedRoot: data)
        client = BackhaulClient(url: daemon.url)
    }

    func makeFile(_ name: String, size: Int) -> String { scratch.makeFile("data/\(name)", size: size) }
}

/// The value of `body`, or a failure once `seconds` have passed (the body is then cancelled).
func within<T: Sendable>(_ seconds: Double, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else { throw TimedOut(seconds: seconds) }
        return value
    }
}

struct TimedOut: Error, CustomStringConvertible {
    var seconds: Double
    var description: String { "not done within \(seconds) s" }
}

/// RFC 3339 for `seconds` from now.
func rfc3339(secondsFromNow seconds: Double) -> String {
    let formatter = ISO8601DateFormatter()
    return formatter.string(from: Date().addingTimeInterval(seconds))
}

@Suite("BackhaulClient against a real daemon: every call, problems, the event stream", .serialized)
struct LiveDaemonTests {
    @Test("info, sessions, tasks and their commands, network, policy, backup, webhooks: each call as the daemon answers it")
    func everyCall() async throws {
        let live = try LiveDaemon()
        let client = live.client
        let info = try await client.info()
        #expect(!info.version.isEmpty && info.protocols.contains("raw") && info.settings["listen"] != nil)

        let created = try await client.createSession("cam", configuration: SessionConfiguration(retry: .init(maxAttempts: 3)))
        #expect(created.id == "cam" && created.enabled && created.configuration?.retry?.maxAttempts == 3)
        try await client.ensureSession("cam")  // exists with another configuration: fine
        #expect(try await client.sessions().map(\.id) == ["cam"])
        let paused = try await client.updateSession("cam", SessionPatch(enabled: false))
        #expect(!paused.enabled)
        #expect(try await client.updateSession("cam", SessionPatch(enabled: true)).enabled)

        // A task held back an hour stays unfinished, so every command applies to it.
        let file = live.makeFile("clip.bin", size: 10_000)
        var later = NewTask.upload(file: file, url: live.sink.url("/later"), headers: [("X-Camera", "3")])
        later.earliestBeginAt = rfc3339(secondsFromNow: 3600)
        later.description = "held"
        let now = NewTask.upload(file: file, url: live.sink.url("/now"))
        let tasks = try await client.createTasks([later, now], session: "cam")
        #expect(tasks.count == 2 && tasks[0].description == "held" && tasks[0].request.headers?["X-Camera"] == "3")
        #expect(tasks[0].file?.path == file && tasks[0].file?.size == 10_000 && tasks[0].kind == .upload)
        let id = tasks[0].id

        let page = try await client.tasks(session: "cam", limit: 1)
        #expect(page.tasks.map(\.id) == [id] && page.nextCursor != nil)
        #expect(try await client.allTasks(session: "cam").map(\.id) == tasks.map(\.id))
        let patched = try await client.updateTask(id, TaskPatch(priority: 0.9, headers: ["X-Camera": nil, "X-Lens": "wide"]))
        #expect(
            patched.priority == 0.9 && patched.request.headers?["X-Lens"] == "wide" && patched.request.headers?["X-Camera"] == nil
        )
        #expect(try await client.suspend(task: id).state == .suspended)
        #expect(try await client.resume(task: id).state != .suspended)
        let cancelled = try await client.cancel(task: id)
        #expect(cancelled.state == .cancelled && cancelled.cancellation?.reason == "user_cancelled")
        #expect(try await client.task(id).state == .cancelled)
        let done = try await within(20) {
            while try await client.task(tasks[1].id).state != .completed { try await Task.sleep(for: .milliseconds(50)) }
            return try await client.attempts(task: tasks[1].id)
        }
        #expect(done.first?.outcome == "completed" && done.first?.bytesSent == 10_000 && done.first?.number == 1)
        try await client.deleteTask(id)
        await #expect(throws: APIError.self) { try await client.task(id) }
        #expect(try await client.allTasks(session: "cam", state: .cancelled).isEmpty)

        let cellular = try await client.setNetwork(NetworkOverride(type: "cellular"))
        #expect(cellular.type == "cellular" && cellular.expensive && cellular.source == "override")
        #expect(try await client.network().type == "cellular")
        #expect(try await client.resetNetwork().source != "override")
        #expect(try await client.policy()["transfers_enabled"] != nil)
        // One daemon on SQLite is a fleet of one: itself, with its network.
        let nodes = try await client.nodes()
        #expect(nodes.count == 1 && nodes.first?.network?.type != nil && !(nodes.first?.version.isEmpty ?? true))

        let backup = try await client.backup(to: live.scratch.file("copy.db"))
        #expect(backup.path == live.scratch.file("copy.db") && backup.bytes > 0)
        #expect(FileManager.default.fileExists(atPath: backup.path))

        let hook = try await client.addWebhook(session: "cam", url: "http://127.0.0.1:9/hooks", events: ["task.completed"])
        #expect(hook.secret?.hasPrefix("whsec_") == true && hook.events == ["task.completed"])
        let hooks = try await client.webhooks(session: "cam")
        #expect(hooks.map(\.id) == [hook.id] && hooks[0].secret == nil)
        try await client.deleteWebhook(hook.id)
        #expect(try await client.webhooks(session: "cam").isEmpty)

        #expect(try await client.deleteSession("cam", mode: .cancel) == nil)
        #expect(try await client.sessions().isEmpty)
    }

    @Test("a problem+json answer is .problem with its stable code, status and detail")
    func problems() async throws {
        let live = try LiveDaemon()
        let client = live.client
        do {
            _ = try await client.task("tsk_nope")
            Issue.record("a task that does not exist was found")
        } catch {
            guard case .problem(let problem) = error else { throw error }
            #expect(problem.code == .notFound && problem.status == 404 && !problem.detail.isEmpty)
        }
        try await client.ensureSession("s1")
        do {
            _ = try await client.createTasks([.upload(file: "/etc/passwd", url: live.sink.url("/x"))], session: "s1")
            Issue.record("a file outside the allowed roots was taken")
        } catch {
            #expect(error.code == .fileOutsideAllowedRoots, "\(error)")
            guard case .problem(let problem) = error else { throw error }
            #expect(problem.status == 403 && problem.field == "tasks[0].file", "\(problem)")
        }
        await #expect(throws: APIError.self) {
            try await client.createSession("s1", configuration: SessionConfiguration(discretionary: true))
        }
        let refused = await #expect(throws: APIError.self) {
            try await client.createSession("s1", configuration: SessionConfiguration(discretionary: true))
        }
        #expect(refused?.code == .sessionExists)
        // Nothing listening: .transport, naming the address.
        let nowhere = BackhaulClient(url: "http://127.0.0.1:1")
        let unreachable = await #expect(throws: APIError.self) { try await nowhere.info() }
        guard case .transport(let failure) = unreachable else {
            Issue.record("\(String(describing: unreachable))")
            return
        }
        #expect(failure.baseURL == "http://127.0.0.1:1")
    }

    @Test("the event stream: a task's events carry it, up to task.completed and session.drained")
    func events() async throws {
        let live = try LiveDaemon()
        let client = live.client
        try await client.ensureSession("s1")
        let file = live.makeFile("a.bin", size: 300_000)
        let stream = client.events(session: "s1")
        let target = live.sink.url("/a")
        // What came, kept outside the body, for the failure's message if it does not end in time.
        let progress = Locked((task: String?.none, types: [String]()))
        let seen: (String, [APIEvent])
        do {
            seen = try await within(30) {
                var events: [APIEvent] = []
                var iterator = stream.makeAsyncIterator()
                // The stream is open once the iterator exists; give the daemon the request first.
                try await Task.sleep(for: .milliseconds(300))
                let task = try await client.createTasks([.upload(file: file, url: target)], session: "s1")[0]
                progress.withLock { $0.task = task.id }
                while let event = try await iterator.next() {
                    events.append(event)
                    progress.withLock { $0.types.append(event.type) }
                    if event.type == "session.drained" { break }
                }
                return (task.id, events)
            }
        } catch let timedOut as TimedOut {
            let (task, types) = progress.withLock { ($0.task, $0.types) }
            let row = task.flatMap { try? live.daemon.task($0).serialized() } ?? "not created"
            let bytes = live.sink.totalBodyBytes
            let log = live.daemon.log(lastLines: 30)
            Issue.record("\(timedOut): events \(types); the task \(row); \(bytes) bytes at the sink; the daemon's log:\n\(log)")
            return
        }
        let (id, events) = seen
        let completed = try #require(events.first { $0.type == "task.completed" })
        #expect(completed.task?.id == id && completed.task?.state == .completed && completed.task?.progress.bytesSent == 300_000)
        #expect(completed.id != nil && completed.timestamp != nil)
        let drained = try #require(events.last)
        #expect(drained.drained?.sessionID == "s1" && drained.drained?.taskCounts[.completed] == 1)
        #expect(live.sink.totalBodyBytes == 300_000)

        // Resumed after the completion: what came after it, again.
        let again = try await within(10) {
            var iterator = client.events(session: "s1", after: completed.id).makeAsyncIterator()
            return try await iterator.next()
        }
        #expect(again?.type == "session.drained")
    }

    @Test("cancelling the task that iterates the event stream ends its loop at once, its connection soon after; so does leaving")
    func cancellation() async throws {
        let live = try LiveDaemon()
        let client = live.client
        let reader = Task {
            var count = 0
            for try await _ in client.events() { count += 1 }
            return count
        }
        try await Task.sleep(for: .milliseconds(500))  // open, and idle: nothing happens on this daemon
        let clock = ContinuousClock()
        let start = clock.now
        reader.cancel()
        let count = try await within(5) { try await reader.value }
        #expect(count == 0 && clock.now - start < .seconds(1), "the loop ends at once")
        // The connection closes when curl next looks (about once a second while idle): its thread
        // ends. The bound is loose because a loaded machine delays that look, not because it may
        // take this long.
        #expect(streamThreads() <= 1)
        _ = try await within(10) {
            while streamThreads() > 0 { try await Task.sleep(for: .milliseconds(50)) }
            return true
        }

        // Leaving a loop early closes the stream too: its thread ends.
        try await client.ensureSession("s1")
        let file = live.makeFile("b.bin", size: 1000)
        let target = live.sink.url("/b")
        // The stream starts from now, and its connection may open after a first task's events on a
        // loaded machine: a task every 300 ms until the loop hears one.
        let producer = Task {
            for _ in 0..<30 where !Task.isCancelled {
                _ = try? await client.createTasks([.upload(file: file, url: target)], session: "s1")
                try? await Task.sleep(for: .milliseconds(300))
            }
        }
        defer { producer.cancel() }
        let first = try await within(10) {
            var iterator = client.events(session: "s1").makeAsyncIterator()
            return try await iterator.next()
        }
        #expect(first?.task != nil)
        let closed = try await within(10) {
            while streamThreads() > 0 { try await Task.sleep(for: .milliseconds(50)) }
            return true
        }
        #expect(closed)
    }
}

/// The threads of this process that carry an event stream (CurlTransport names them).
private func streamThreads() -> Int {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    return tasks.filter { task in
        let name = (try? String(contentsOfFile: "/proc/self/task/\(task)/comm", encoding: .utf8)) ?? ""
        return name.hasPrefix("bh-client-sse")
    }.count
}
