import BackhaulTesting
import Foundation
import JSONCodec
import Testing

extension EndToEndTests {
    @Test("without tokens the daemon refuses a non-loopback address; with a token file it serves it, and only to token holders")
    func tokensOpenTheNetwork() throws {
        let scratch = TemporaryDirectory("backhaul-e2e")
        try FileManager.default.createDirectory(atPath: scratch.file("data"), withIntermediateDirectories: true)
        #expect(throws: DaemonProcess.DaemonError.self) {
            _ = try DaemonProcess(
                stateDirectory: scratch.file("open"), allowedRoot: scratch.file("data"), arguments: ["--listen", "0.0.0.0:0"])
        }
        let admin = "admin-secret-token-4242"
        try "\(admin) admin\nclient-secret-token-77 client cam-*\n".write(
            toFile: scratch.file("tokens"), atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess(
            stateDirectory: scratch.file("state"), allowedRoot: scratch.file("data"),
            arguments: ["--listen", "0.0.0.0:0", "--token-file", scratch.file("tokens")])
        #expect(try daemon.call("GET", "/v1/sessions").0 == 401)
        #expect(try daemon.call("GET", "/healthz").0 == 200)
        #expect(
            try daemon.call("PUT", "/v1/sessions/cam-1", ["configuration": [:]], headers: ["Authorization: Bearer \(admin)"]).0
                == 201)
        #expect(try daemon.call("GET", "/v1/sessions/cam-1", headers: ["Authorization: Bearer client-secret-token-77"]).0 == 200)
        #expect(
            try daemon.call("GET", "/v1/events?session=dog-1", headers: ["Authorization: Bearer client-secret-token-77"]).0 == 403
        )
        let info = try daemon.call("GET", "/v1/info", headers: ["Authorization: Bearer \(admin)"])
        #expect(info.1["authentication"]?.stringValue == "bearer tokens")
        #expect(!info.1.serialized().contains(admin))
        #expect(!daemon.log(lastLines: 10_000).contains(admin), "the token never reaches the log")
    }

    /// Issue 15.5: the scope `a*a*…*b` against a session id of 64 `a`s kept a core spinning for
    /// more than a minute (the glob matcher backtracked exponentially); now it answers at once.
    @Test("a hostile scope pattern against a long session id answers within seconds")
    func hostileScopePattern() throws {
        let scratch = TemporaryDirectory("backhaul-e2e")
        try FileManager.default.createDirectory(atPath: scratch.file("data"), withIntermediateDirectories: true)
        let client = "client-secret-token-78"
        try "\(client) client a*a*a*a*a*a*a*a*a*a*a*a*b\n".write(
            toFile: scratch.file("tokens"), atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess(
            stateDirectory: scratch.file("state"), allowedRoot: scratch.file("data"),
            arguments: ["--token-file", scratch.file("tokens")])
        let (status, problem) = try daemon.call(
            "GET", "/v1/sessions/" + String(repeating: "a", count: 64),
            headers: ["Authorization: Bearer \(client)"], timeout: 10)
        #expect(status == 404 && problem["code"]?.stringValue == "not_found")
        #expect(try daemon.call("GET", "/healthz", timeout: 5).0 == 200, "the daemon is not left spinning")
    }
}

extension EndToEndTests {
    @Test("--deny-private-destinations: an IP literal is refused at enqueue, a name that resolves to loopback at connect")
    func denyPrivateDestinations() throws {
        let fixture = try Fixture(daemonArguments: ["--deny-private-destinations"])
        try fixture.session()
        let file = fixture.makeFile("a.bin", size: 1000)
        let literal = try fixture.daemon.call(
            "POST", "/v1/sessions/s1/tasks",
            [
                "file": .string(file), "request": ["url": .string(fixture.sink.url("/x")), "method": "PUT"],
            ])
        #expect(literal.0 == 403 && literal.1["code"]?.stringValue == "destination_not_allowed")
        #expect(literal.1["field"]?.stringValue == "request.url")
        let byName = try fixture.daemon.call(
            "POST", "/v1/sessions/s1/tasks",
            [
                "file": .string(file), "request": ["url": .string("http://localhost:\(fixture.sink.port)/x"), "method": "PUT"],
            ])
        #expect(byName.0 == 201)
        let task = try fixture.daemon.waitForTask(byName.1["id"]?.stringValue ?? "")
        #expect(task["state"]?.stringValue == "failed" && task["error"]?["code"]?.intValue == -1004)
        #expect(fixture.sink.requests.isEmpty, "no request reached the private address")
        let hook = try fixture.daemon.call("POST", "/v1/sessions/s1/webhooks", ["url": "http://10.1.2.3/hook"])
        #expect(hook.0 == 403 && hook.1["code"]?.stringValue == "destination_not_allowed")
    }

    @Test("host allow-lists for uploads and webhooks; a cap on open tasks per session")
    func allowListsAndQuota() throws {
        let fixture = try Fixture(daemonArguments: [
            "--allow-upload-host", "http://127.0.0.1", "--allow-webhook-host", "hooks.example",
            "--max-open-tasks", "2",
        ])
        try fixture.session("s1", ["allows_cellular_access": false])
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "cellular"]).0 == 200)
        let file = fixture.makeFile("a.bin", size: 1000)
        let elsewhere = try fixture.daemon.call(
            "POST", "/v1/sessions/s1/tasks",
            [
                "file": .string(file), "request": ["url": "https://uploads.example/x", "method": "PUT"],
            ])
        #expect(elsewhere.0 == 403 && elsewhere.1["code"]?.stringValue == "destination_not_allowed")
        _ = try fixture.enqueue(file)
        _ = try fixture.enqueue(file)
        let third = try fixture.daemon.call(
            "POST", "/v1/sessions/s1/tasks",
            [
                "file": .string(file), "request": ["url": .string(fixture.sink.url("/x")), "method": "PUT"],
            ])
        #expect(third.0 == 429 && third.1["code"]?.stringValue == "too_many_tasks")
        #expect(try fixture.daemon.call("POST", "/v1/sessions/s1/webhooks", ["url": "http://127.0.0.1:9/h"]).0 == 403)
        #expect(try fixture.daemon.call("POST", "/v1/sessions/s1/webhooks", ["url": "https://hooks.example/h"]).0 == 201)
    }

    @Test("a known secret (default header, Authorization, Cookie) appears in no API answer, event or log line")
    func secretsNeverLeak() throws {
        let fixture = try Fixture()
        let secret = "sEcReT-9f8e7d6c5b4a"
        try fixture.session("s1", ["default_headers": ["X-Api-Key": .string(secret)]])
        let hook = try fixture.daemon.call("POST", "/v1/sessions/s1/webhooks", ["url": "http://127.0.0.1:9/h"]).1
        let file = fixture.makeFile("a.bin", size: 1000)
        let id = try fixture.enqueue(
            file,
            extra: [
                "request": [
                    "url": .string(fixture.sink.url("/x")), "method": "PUT",
                    "headers": ["Authorization": .string("Bearer \(secret)"), "Cookie": .string("s=\(secret)")],
                ]
            ])
        let task = try fixture.daemon.waitForTask(id)
        #expect(task["state"]?.stringValue == "completed")
        #expect(fixture.sink.requests.last?.headers["authorization"] == "Bearer \(secret)", "the secret is used")
        var answers = [task.serialized()]
        for path in [
            "/v1/sessions/s1", "/v1/sessions/s1/tasks", "/v1/sessions", "/v1/info", "/v1/sessions/s1/webhooks",
            "/v1/webhooks/\(hook["id"]?.stringValue ?? "")", "/v1/webhooks/\(hook["id"]?.stringValue ?? "")/deliveries",
        ] {
            answers.append(try fixture.daemon.call("GET", path).1.serialized())
        }
        // The event log, replayed by the SSE stream (curl reads it for two seconds).
        let curl = Process()
        curl.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        curl.arguments = ["-sN", "-m", "2", "http://127.0.0.1:\(fixture.daemon.port)/v1/events?after=0"]
        let output = Pipe()
        curl.standardOutput = output
        try curl.run()
        let stream = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        curl.waitUntilExit()
        #expect(stream.contains("task.completed"))
        answers.append(stream)
        for answer in answers { #expect(!answer.contains(secret), "\(answer)") }
        #expect(!fixture.daemon.log(lastLines: 100_000).contains(secret))
    }
}

extension EndToEndTests {
    @Test("a file swapped for a symlink after the check is not followed: the task fails and nothing is sent")
    func symlinkSwapAfterCheck() throws {
        let fixture = try Fixture()
        try fixture.session()
        let file = fixture.makeFile("report.bin", size: 4096)
        let secret = fixture.scratch.makeFile("outside-secret.bin", size: 4096)
        let begin = Date().addingTimeInterval(1.5).timeIntervalSince1970
        let id = try fixture.enqueue(file, extra: ["earliest_begin_at": .string(rfc3339(begin))])
        try FileManager.default.removeItem(atPath: file)
        try FileManager.default.createSymbolicLink(atPath: file, withDestinationPath: secret)
        let task = try fixture.daemon.waitForTask(id, timeout: 10)
        #expect(task["state"]?.stringValue == "failed", "\(task.serialized())")
        #expect(fixture.sink.requests.isEmpty, "the file outside the roots was never sent")
    }
}

extension EndToEndTests {
    @Test("https certificates are verified: a self-signed server fails -1200, and is trusted once given as --ca-bundle")
    func certificateVerification() throws {
        let scratch = TemporaryDirectory("backhaul-e2e")
        let certificate = try SelfSignedCertificate(directory: scratch.path)
        let sink = try PythonPeer(
            script: "tls_sink.py", arguments: ["--cert", certificate.certificate, "--key", certificate.key])
        let url = JSON.string("https://127.0.0.1:\(sink.port)/upload")

        let untrusting = try Fixture()
        try untrusting.session()
        let file = untrusting.makeFile("a.bin", size: 10_000)
        let refused = try untrusting.daemon.waitForTask(
            try untrusting.enqueue(file, extra: ["request": ["url": url, "method": "PUT"]]))
        #expect(
            refused["state"]?.stringValue == "failed" && refused["error"]?["code"]?.intValue == -1200, "\(refused.serialized())")

        let trusting = try Fixture(daemonArguments: ["--ca-bundle", certificate.certificate])
        try trusting.session()
        let other = trusting.makeFile("a.bin", size: 10_000)
        let sent = try trusting.daemon.waitForTask(
            try trusting.enqueue(other, extra: ["request": ["url": url, "method": "PUT"]]))
        #expect(sent["state"]?.stringValue == "completed", "\(sent.serialized())")
    }
}
