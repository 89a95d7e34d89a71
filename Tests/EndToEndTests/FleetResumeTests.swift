import BackhaulTesting
import Curl
import Foundation
import Glibc
import JSONCodec
import PostgreSQL
import Testing
import Threads

/// A real peer of one resumable protocol, as the takeover test sees it: what a task sends to it,
/// what it acknowledged and received, and where the upload went on after the takeover.
struct ResumablePeer {
    /// The task's `request`, `upload` (and `s3`) members.
    var task: JSONObject
    /// Body bytes the server has acknowledged (stored for good).
    var acknowledged: () -> Int64
    /// Body bytes the server received over every request of the upload.
    var received: () -> Int64
    /// The upload's bytes as the server holds them at the end.
    var contents: () -> Data
    /// The file offset of the first data request after the upload asked the server where it was
    /// (nil when it never asked): where the next node resumed.
    var resumedAt: () -> Int64?
    /// How many times the upload was created at the server (1 when the takeover resumed it).
    var creations: () -> Int
    /// The server's request log, for a failure's message.
    var log: () -> String
    /// The processes and servers that must live as long as the test.
    var keep: [AnyObject]

    static let chunk = 1 << 20

    static func make(_ protocolName: String, directory: String, size: Int) throws -> ResumablePeer {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        return switch protocolName {
        case "tus": try tus(directory)
        case "chunked": try chunked(directory, size: size)
        case "ietf": try ietf(directory)
        default: try s3(directory)
        }
    }

    static func methods(_ requests: [JSON], _ method: String) -> [JSON] {
        requests.filter { $0["method"]?.stringValue == method }
    }

    static func summary(_ requests: [JSON]) -> String {
        requests.map { $0.serialized() }.joined(separator: "\n")
    }

    static func tus(_ directory: String) throws -> ResumablePeer {
        let server = try TusServer(directory: directory)
        return ResumablePeer(
            task: [
                "request": ["url": .string(server.creationURL), "method": "POST"],
                "upload": ["protocol": "tus", "chunk_size": .int(Int64(chunk))],
            ],
            acknowledged: {
                methods(server.requests, "PATCH").filter { $0["status"]?.intValue == 204 }.reduce(Int64(0)) {
                    $0 + ($1["content_length"]?.intValue ?? 0)
                }
            },
            received: { PythonPeer.bodyBytes(server.requests, method: "PATCH") },
            contents: { server.uploads.first.flatMap { FileManager.default.contents(atPath: $0) } ?? Data() },
            resumedAt: {
                let requests = server.requests
                guard let asked = requests.firstIndex(where: { $0["method"]?.stringValue == "HEAD" }) else { return nil }
                return methods(Array(requests[asked...]), "PATCH").first.flatMap { Int64($0["upload_offset"]?.stringValue ?? "") }
            },
            creations: { methods(server.requests, "POST").count }, log: { summary(server.requests) }, keep: [server])
    }

    static func chunked(_ directory: String, size: Int) throws -> ResumablePeer {
        let sink = try RecordingSink(directory: directory + "/sink", fallback: .resumable)
        let ranges = { sink.requests.compactMap { $0.headers["content-range"] } }
        return ResumablePeer(
            task: [
                "request": ["url": .string(sink.url("/big")), "method": "PUT"],
                "upload": ["protocol": "chunked", "chunk_size": .int(Int64(chunk))],
            ],
            acknowledged: {
                sink.requests.filter { $0.status == 308 || $0.status == 201 }.reduce(Int64(0)) { $0 + $1.bodyLength }
            },
            received: { sink.totalBodyBytes },
            contents: { sink.assembled("/big") },
            resumedAt: {
                let all = ranges()
                guard let asked = all.firstIndex(of: "bytes */\(size)") else { return nil }
                return all[asked...].dropFirst().first.flatMap { range in
                    Int64(range.dropFirst("bytes ".count).split(separator: "-").first ?? "")
                }
            },
            creations: { ranges().filter { $0.hasPrefix("bytes 0-") }.count },
            log: { ranges().joined(separator: "\n") }, keep: [sink])
    }

    static func ietf(_ directory: String) throws -> ResumablePeer {
        let server = try IETFServer(directory: directory)
        return ResumablePeer(
            task: [
                "request": ["url": .string(server.url("/up/big.bin")), "method": "POST"], "upload": ["protocol": "ietf"],
            ],
            acknowledged: { server.partialBytes },
            received: {
                PythonPeer.bodyBytes(server.requests, method: "POST") + PythonPeer.bodyBytes(server.requests, method: "PATCH")
            },
            contents: { server.uploads.first.flatMap { FileManager.default.contents(atPath: $0) } ?? Data() },
            resumedAt: {
                let requests = server.requests
                guard let asked = requests.firstIndex(where: { $0["method"]?.stringValue == "HEAD" }) else { return nil }
                return methods(Array(requests[asked...]), "PATCH").first.flatMap { Int64($0["upload_offset"]?.stringValue ?? "") }
            },
            creations: { methods(server.requests, "POST").count }, log: { summary(server.requests) }, keep: [server])
    }

    static func s3(_ directory: String) throws -> ResumablePeer {
        let server = try S3Server(directory: directory)
        let part = 5 << 20
        func partNumber(_ request: JSON) -> Int? {
            guard request["method"]?.stringValue == "PUT" else { return nil }
            let fields = (request["query"]?.stringValue ?? "").split(separator: "&")
            return fields.first { $0.hasPrefix("partNumber=") }.flatMap { Int($0.dropFirst("partNumber=".count)) }
        }
        return ResumablePeer(
            task: [
                "request": ["url": .string(server.objectURL("big.bin")), "method": "PUT"],
                "upload": ["protocol": "s3", "chunk_size": .int(Int64(part))], "s3": server.taskCredentials,
            ],
            // The server logs a request as it begins and the parts go one after the other: every
            // part but the last one logged was answered.
            acknowledged: {
                server.requests.filter { partNumber($0) != nil }.dropLast().reduce(Int64(0)) {
                    $0 + ($1["content_length"]?.intValue ?? 0)
                }
            },
            received: { PythonPeer.bodyBytes(server.requests, method: "PUT") },
            contents: { server.object("big.bin") },
            resumedAt: {
                let requests = server.requests
                // ListParts: a GET on the upload.
                guard
                    let asked = requests.firstIndex(where: {
                        $0["method"]?.stringValue == "GET" && ($0["query"]?.stringValue ?? "").hasPrefix("uploadId=")
                    })
                else { return nil }
                return requests[asked...].lazy.compactMap(partNumber).first.map { Int64(($0 - 1) * part) }
            },
            creations: {
                // CreateMultipartUpload: a POST on the key without an upload id (the Complete has one).
                server.requests.filter {
                    $0["method"]?.stringValue == "POST" && $0["path"]?.stringValue == "/\(server.bucket)/big.bin"
                        && !($0["query"]?.stringValue ?? "").contains("uploadId=")
                }.count
            },
            log: { summary(server.requests) }, keep: [server])
    }
}

/// The fleet when a node dies mid-upload, when the database goes away, and when it cannot be
/// reached at all.
extension FleetTests {
    /// The node holding a task's lease, as the database says.
    func leaseHolder(_ id: String, _ db: PostgresConnection) throws -> String? {
        try db.execute("SELECT lease_node FROM tasks WHERE id = $1 AND state = 'running'", [.text(id)]).string(0, 0)
    }

    @Test(
        "a long upload resumes on another node from the server's offset after its node is SIGKILLed",
        arguments: ["tus", "chunked", "ietf", "s3"])
    func longUploadResumesOnAnotherNode(_ protocolName: String) throws {
        let lease = 2.0
        // Multipart S3 needs parts of 5 MiB: three of them and a bit.
        let size = protocolName == "s3" ? 16 << 20 : 12 << 20
        let peer = try ResumablePeer.make(protocolName, directory: scratch.file("peer-\(protocolName)"), size: size)
        let file = scratch.makeFile("shared/\(protocolName).bin", size: size)
        let a = try node("a", lease: lease)
        // 2 MB/s for the whole fleet's policy: the upload takes 6 to 8 s.
        try #require(try a.call("PUT", "/v1/policy", ["bandwidth_limit": .int(2_000_000)]).0 == 200)
        try #require(try a.call("PUT", "/v1/sessions/long", ["configuration": [:]]).0 == 201)
        var task = peer.task
        task["file"] = .string(file)
        let (status, body) = try a.call("POST", "/v1/sessions/long/tasks", .object(task))
        try #require(status == 201, "\(body.serialized())")
        let id = try #require(body["id"]?.stringValue)
        let db = try PostgresConnection(database.url)
        try #require(eventually(timeout: 20) { (try? leaseHolder(id, db)) == "a" }, "a never ran it:\n\(a.log())")
        // b joins while a runs the upload: it must leave a's lease alone.
        let b = try node("b", lease: lease)
        // Past the middle, acknowledged: starting over would send at least 1.5× the file.
        let acknowledged = eventually(timeout: 30, interval: 0.02) { peer.acknowledged() >= Int64(size) * 55 / 100 }
        try #require(acknowledged, "the server acknowledged \(peer.acknowledged()) of \(size):\n\(peer.log())")
        #expect(try leaseHolder(id, db) == "a", "b took a's running upload while a was alive")
        let before = try b.task(id)
        a.kill9()
        let killedAt = Date()
        let taken = eventually(timeout: lease + 10, interval: 0.05) { (try? leaseHolder(id, db)) == "b" }
        let takeover = Date().timeIntervalSince(killedAt)
        try #require(taken, "b never took the upload over:\n\(b.log())")
        let done = try b.waitForTask(id, timeout: 90)
        #expect(done["state"]?.stringValue == "completed", "\(done.serialized())\n\(peer.log())\n\(b.log())")
        #expect(Bytes(peer.contents()) == Bytes(FileManager.default.contents(atPath: file) ?? Data([1])))
        // Resumed, not restarted: one upload at the server, b went on from a non-zero offset, and
        // well under the file again crossed the link.
        let resumedAt = peer.resumedAt()
        #expect((resumedAt ?? 0) > 0, "b did not resume from the server's offset:\n\(peer.log())")
        #expect(peer.creations() == 1, "the upload was created \(peer.creations()) times:\n\(peer.log())")
        let received = peer.received()
        #expect(Double(received) < 1.5 * Double(size), "the server received \(received) for \(size)")
        #expect((done["attempts"]?.intValue ?? 0) >= 2, "the takeover counts an attempt: \(done.serialized())")
        print(
            "fleet resume \(protocolName): killed a at \(before["progress"]?["bytes_sent"]?.intValue ?? -1) bytes sent "
                + "(\(peer.acknowledged()) acknowledged at the end), b took over after \(String(format: "%.2f", takeover)) s "
                + "(lease \(lease) s), resumed at \(resumedAt ?? -1), \(received - Int64(size)) bytes re-sent for "
                + "\(size), attempts \(done["attempts"]?.intValue ?? -1)")
    }

    /// Starts `backhauld` on `url` expecting it not to start: its exit status (nil when it still
    /// ran after 20 s, then killed), how long it took, and its log.
    func refusedStart(_ url: String, name: String) throws -> (status: Int32?, seconds: Double, log: String) {
        let logFile = scratch.file("refused-\(name).log")
        _ = FileManager.default.createFile(atPath: logFile, contents: nil)
        let output = try #require(FileHandle(forWritingAtPath: logFile))
        defer { try? output.close() }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: DaemonProcess.binary)
        process.arguments = [
            "--listen", "127.0.0.1:0", "--state", url, "--node-id", name, "--state-dir", scratch.file("state-\(name)"),
            "--allow-root", shared, "--network-source", "routing-table",
        ]
        process.standardError = output
        process.standardOutput = output
        let started = Date()
        try process.run()
        let ended = eventually(timeout: 20, interval: 0.02) { !process.isRunning }
        let seconds = Date().timeIntervalSince(started)
        if !ended {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        let log = (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? ""
        return (ended ? process.terminationStatus : nil, seconds, log)
    }

    /// The message and error of the daemon's "cannot start" line, if it wrote one.
    static func cannotStart(_ log: String) -> String? {
        log.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }.first {
            $0["msg"]?.stringValue?.hasPrefix("cannot start") == true
        }.map { "\($0["msg"]?.stringValue ?? "") / \($0["error"]?.stringValue ?? "")" }
    }

    @Test("a wrong password or a port where nothing listens exits 78 saying why; a newer schema exits 66")
    func refusedDatabase() throws {
        let nobody = try freePort()
        let cases = [
            ("password", "postgres://backhaul:wrong@127.0.0.1:\(database.port)/backhaul", "password authentication failed"),
            ("port", "postgres://backhaul:\(database.password)@127.0.0.1:\(nobody)/backhaul", "Connection refused"),
        ]
        for (name, url, reason) in cases {
            let (status, seconds, log) = try refusedStart(url, name: name)
            #expect(status == 78, "\(name): exit \(status.map(String.init) ?? "none") after \(seconds) s:\n\(log)")
            #expect(seconds < 10, "\(name): exit after \(seconds) s")
            let line = Self.cannotStart(log)
            #expect(line?.localizedCaseInsensitiveContains(reason) == true, "\(name): \(line ?? "no cannot-start line"):\n\(log)")
            #expect(!log.contains(database.password), "the log shows the database's password")
            print("fleet refused (\(name)): exit \(status ?? -1) after \(String(format: "%.2f", seconds)) s: \(line ?? "")")
        }
        // A database a newer backhauld migrated: a node that starts once creates the schema, then
        // the schema's version is moved past what this build knows.
        let first = try node("first", lease: 2)
        #expect(first.terminate(timeout: 20) == 0)
        let db = try PostgresConnection(database.url)
        try db.execute("INSERT INTO backhaul_schema VALUES (99)")
        let (status, seconds, log) = try refusedStart(database.url, name: "older")
        #expect(status == 66, "exit \(status.map(String.init) ?? "none") after \(seconds) s:\n\(log)")
        let line = Self.cannotStart(log)
        #expect(line?.contains("99") == true, "\(line ?? "no cannot-start line"):\n\(log)")
        print("fleet refused (newer schema): exit \(status ?? -1) after \(String(format: "%.2f", seconds)) s: \(line ?? "")")
    }

    /// The policy lives in the shared database: a change on one node holds on the others, and a
    /// node's own earlier change does not come back over another node's newer one.
    @Test("a policy set on one node holds on every node")
    func policySharedAcrossNodes() throws {
        let a = try node("a", lease: 2)
        let b = try node("b", lease: 2)
        func limit(_ daemon: DaemonProcess) -> Int64? {
            (try? daemon.call("GET", "/v1/policy"))?.1["bandwidth_limit"]?.intValue
        }
        for (writer, reader, value) in [(a, b, 400_000), (b, a, 300_000), (a, b, 500_000)]
            as [(DaemonProcess, DaemonProcess, Int64)]
        {
            try #require(try writer.call("PUT", "/v1/policy", ["bandwidth_limit": .int(value)]).0 == 200)
            #expect(limit(writer) == value)
            let seen = eventually(timeout: 5) { limit(reader) == value }
            #expect(seen, "set \(value) on one node, the other shows \(limit(reader).map(String.init) ?? "none")")
        }
    }

    @Test(
        "the database goes away under load: /readyz 503 within a lease, /healthz 200, transfers stop; back: ready again, every task accepted completes byte-exact"
    )
    func databaseGoesAway() throws {
        let lease = 2.0
        let outage = Double(ProcessInfo.processInfo.environment["FLEET_OUTAGE_SECONDS"] ?? "") ?? 4
        let sink = try RecordingSink(directory: scratch.file("sink-outage"), fallback: .resumable)
        let nodes = try ["a", "b"].map { try node($0, lease: lease) }
        // 400 KB/s a node: 12 MiB take about 15 s, the outage lands in the middle.
        try #require(try nodes[0].call("PUT", "/v1/policy", ["bandwidth_limit": .int(400_000)]).0 == 200)
        try #require(try nodes[0].call("PUT", "/v1/sessions/outage", ["configuration": [:]]).0 == 201)
        func upload(_ name: String) -> JSON {
            [
                "file": .string(scratch.makeFile("shared/\(name)", size: 3 << 20)),
                "request": ["url": .string(sink.url("/outage/\(name)")), "method": "PUT"],
                "upload": ["protocol": "chunked", "chunk_size": .int(256 << 10)],
            ]
        }
        let names = (0..<4).map { "o\($0).bin" }
        let (status, body) = try nodes[0].call("POST", "/v1/sessions/outage/tasks", ["tasks": .array(names.map(upload))])
        try #require(status == 201, "\(body.serialized())")
        var ids = body["tasks"]?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? []
        try #require(ids.count == names.count)
        let db = try PostgresConnection(database.url)
        try #require(eventually(timeout: 20) { sink.totalBodyBytes >= 1 << 20 }, "no transfer started")
        let runners = try db.execute("SELECT DISTINCT lease_node FROM tasks WHERE state = 'running' ORDER BY 1")
        let running = (0..<runners.count).compactMap { runners.string($0, 0) }
        // The policy set on a holds b too: the uploads are still under way when the database stops.
        try #require(!running.isEmpty && sink.totalBodyBytes < 8 << 20, "\(sink.totalBodyBytes) bytes already arrived")

        // The database stops as a crash would; a client enqueues during the outage, on its own thread.
        let stoppedAt = Date()
        try database.stop(immediate: true)
        let stopSeconds = Date().timeIntervalSince(stoppedAt)
        let late = upload("late.bin")
        let lateAnswer = Locked<(Int, JSON, Double)?>(nil)
        let lateURL = nodes[1].url + "/v1/sessions/outage/tasks"
        let lateThread = Thread {
            let answer = (try? HTTPClient().send("POST", lateURL, body: late.serializedBytes(), timeoutSeconds: 60)).map {
                ($0.status, (try? JSON.parse($0.body)) ?? .null, Date().timeIntervalSince(stoppedAt))
            }
            lateAnswer.withLockNotifyingAll { $0 = answer ?? (0, .null, Date().timeIntervalSince(stoppedAt)) }
        }
        lateThread.start()
        // Watch for a lease and `outage` seconds: each node's /readyz and /healthz, and the bytes arriving.
        var notReadyAfter: [Double?] = [nil, nil]
        var healthy = true
        var bytes = sink.totalBodyBytes
        var lastByteAfter = 0.0
        while Date().timeIntervalSince(stoppedAt) < lease + outage {
            let elapsed = Date().timeIntervalSince(stoppedAt)
            for (index, daemon) in nodes.enumerated() {
                if notReadyAfter[index] == nil, (try? daemon.call("GET", "/readyz", timeout: 5))?.0 == 503 {
                    notReadyAfter[index] = elapsed
                }
                if (try? daemon.call("GET", "/healthz", timeout: 5))?.0 != 200 { healthy = false }
            }
            let now = sink.totalBodyBytes
            if now != bytes {
                bytes = now
                lastByteAfter = elapsed
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        let quietBytes = sink.totalBodyBytes
        #expect(notReadyAfter.allSatisfy { ($0 ?? .infinity) <= lease + 2 }, "/readyz 503 after \(notReadyAfter) s")
        #expect(healthy, "/healthz failed while the database was away")
        #expect(nodes.allSatisfy { $0.isRunning }, "a node died with the database")
        #expect(lastByteAfter <= lease + 1.5, "bytes still arrived \(lastByteAfter) s after the database stopped")

        // Back: ready again, and every task accepted completes, each byte-exact.
        let startedAt = Date()
        try database.start()
        var readyAfter: [Double?] = [nil, nil]
        eventually(timeout: 30, interval: 0.1) {
            for (index, daemon) in nodes.enumerated() where readyAfter[index] == nil {
                if (try? daemon.call("GET", "/readyz", timeout: 5))?.0 == 200 {
                    readyAfter[index] = Date().timeIntervalSince(startedAt)
                }
            }
            return readyAfter.allSatisfy { $0 != nil }
        }
        #expect(readyAfter.allSatisfy { ($0 ?? .infinity) <= 10 }, "/readyz 200 after \(readyAfter) s:\n\(nodes[1].log())")
        let answered = lateAnswer.wait(until: { $0 != nil }, timeout: 60) { $0 }
        var expected = names
        if let (status, body, _) = answered, status == 201, let id = body["tasks"]?.arrayValue?.first?["id"]?.stringValue {
            ids.append(id)
            expected.append("late.bin")
        }
        let finished = ids.map { (try? nodes[0].waitForTask($0, timeout: 90)) ?? .null }
        #expect(
            finished.allSatisfy { $0["state"]?.stringValue == "completed" },
            "\(finished.map { $0.serialized() })\n\(nodes[0].log())\n\(nodes[1].log())")
        let count = try PostgresConnection(database.url).execute("SELECT count(*) FROM tasks").int(0, 0) ?? 0
        #expect(count == Int64(expected.count), "\(count) tasks in the database, \(expected.count) accepted")
        for name in expected {
            #expect(
                Bytes(sink.assembled("/outage/\(name)"))
                    == Bytes(FileManager.default.contents(atPath: shared + "/" + name) ?? Data([1])), "\(name) differs")
        }
        let attempts = finished.map { $0["attempts"]?.intValue ?? -1 }
        print(
            "fleet outage: stopping PostgreSQL took \(String(format: "%.2f", stopSeconds)) s; running on \(running); /readyz 503 after \(notReadyAfter) s (lease \(lease) s), last byte "
                + "\(String(format: "%.2f", lastByteAfter)) s after the stop, \(quietBytes) bytes by then; /readyz 200 again "
                + "\(readyAfter) s after the start; the POST during the outage: \(answered.map { "\($0.0) after \(String(format: "%.2f", $0.2)) s \($0.1.serialized())" } ?? "no answer"); "
                + "attempts \(attempts); \(sink.totalBodyBytes) bytes received for \(expected.count) × 3 MiB")
    }
}
