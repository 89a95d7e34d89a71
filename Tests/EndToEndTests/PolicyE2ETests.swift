import BackhaulTesting
import Curl
import Foundation
import JSONCodec
import Testing

extension EndToEndTests {
    func state(_ fixture: Fixture, _ id: String) throws -> (String, String?) {
        let task = try fixture.daemon.call("GET", "/v1/tasks/\(id)").1
        return (task["state"]?.stringValue ?? "", task["waiting_reason"]?.stringValue)
    }

    /// Waits for a state (and reason); returns the seconds it took.
    func waitFor(_ fixture: Fixture, _ id: String, _ state: String, _ reason: String? = nil, timeout: Double = 10) throws
        -> Double
    {
        let started = Date()
        let reached = try eventually(timeout: timeout, interval: 0.02) { try self.state(fixture, id) == (state, reason) }
        fixture.expectLog(
            reached,
            "\(id) never reached \(state)/\(reason ?? "-"): \(try self.state(fixture, id))\n"
                + fixture.daemon.log(lastLines: 400).split(separator: "\n").filter {
                    $0.contains("budget") || $0.contains("policy") || $0.contains("started")
                }.joined(separator: "\n"))
        return Date().timeIntervalSince(started)
    }

    @Test("network override: cellular stops a running chunked upload within a second; wifi resumes it from its offset")
    func networkOverrideStopsAndResumes() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 4_000_000, then: .resumable))
        try fixture.session("s1", ["allows_cellular_access": false])
        let size = 24 * 1024 * 1024
        let file = fixture.makeFile("video.bin", size: size)
        let id = try fixture.enqueue(file, path: "/v", extra: ["upload": ["protocol": "chunked", "chunk_size": 1_048_576]])
        try #require(eventually(timeout: 20) { fixture.sink.totalBodyBytes > 3_000_000 })
        let (status, network) = try fixture.daemon.call("PUT", "/v1/network", ["type": "cellular", "interface": "wwan0"])
        #expect(status == 200 && network["expensive"]?.boolValue == true && network["source"]?.stringValue == "override")
        let took = try waitFor(fixture, id, "waiting", "cellular_not_allowed")
        #expect(took < 1.0, "the policy stopped the transfer after \(took) s")
        print("policy: a network change stopped a running transfer in \(String(format: "%.3f", took)) s")
        let sentBefore = fixture.sink.totalBodyBytes
        Thread.sleep(forTimeInterval: 0.5)
        #expect(fixture.sink.totalBodyBytes - sentBefore < 1_100_000, "nothing more than the chunk in flight moves while waiting")
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "wifi"]).0 == 200)
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(Bytes(fixture.sink.assembled("/v")) == Bytes(fixture.contents(file)))
        let resent = fixture.sink.totalBodyBytes - Int64(size)
        #expect(resent < 2 * 1_048_576, "re-sent \(resent) bytes")
        #expect(try fixture.daemon.call("DELETE", "/v1/network").1["source"]?.stringValue == "routing_table")
    }

    @Test("detection: the default route moving to wwan0 holds the task, back to eth0 releases it; no route is no_connectivity")
    func routeDetection() throws {
        let fixture = try Fixture()
        try fixture.session("s1", ["allows_cellular_access": false])
        #expect(try fixture.daemon.call("GET", "/v1/network").1["type"]?.stringValue == "wired")
        try fixture.daemon.setDefaultRoute("wwan0")
        #expect(eventually(timeout: 5) { (try? fixture.daemon.call("GET", "/v1/network").1["type"]?.stringValue) == "cellular" })
        let file = fixture.makeFile("a.bin", size: 100_000)
        let id = try fixture.enqueue(file)
        _ = try waitFor(fixture, id, "waiting", "cellular_not_allowed")
        try fixture.daemon.setDefaultRoute(nil)
        _ = try waitFor(fixture, id, "waiting", "no_connectivity")
        try fixture.daemon.setDefaultRoute("eth0")
        #expect(try fixture.daemon.waitForTask(id)["state"]?.stringValue == "completed")
    }

    @Test("waits_for_connectivity false: no network fails -1009, a forbidden network fails -1020")
    func mayNotWait() throws {
        let fixture = try Fixture()
        try fixture.session("s1", ["waits_for_connectivity": false, "allows_expensive_network_access": false])
        let file = fixture.makeFile("a.bin", size: 1000)
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "none"]).0 == 200)
        let offline = try fixture.daemon.waitForTask(try fixture.enqueue(file))
        #expect(offline["state"]?.stringValue == "failed" && offline["error"]?["code"]?.intValue == -1009)
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "wifi", "expensive": true]).0 == 200)
        let expensive = try fixture.daemon.waitForTask(try fixture.enqueue(file))
        #expect(expensive["state"]?.stringValue == "failed" && expensive["error"]?["code"]?.intValue == -1020)
    }

    @Test("constrained network: held; a PATCH allowing it (the task's own configuration) releases it")
    func patchReleasesHeldTask() throws {
        let fixture = try Fixture()
        try fixture.session()
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "wired", "constrained": true]).0 == 200)
        let file = fixture.makeFile("a.bin", size: 1000)
        let id = try fixture.enqueue(file, extra: ["configuration": ["allows_constrained_network_access": false]])
        _ = try waitFor(fixture, id, "waiting", "constrained_network_not_allowed")
        #expect(
            try fixture.daemon.call("PATCH", "/v1/tasks/\(id)", ["configuration": ["allows_constrained_network_access": true]]).0
                == 200)
        #expect(try fixture.daemon.waitForTask(id)["state"]?.stringValue == "completed")
    }

    @Test("discretionary: deferred on an expensive network, released on a cheap one; the daily budget holds it once spent")
    func discretionaryAndBudget() throws {
        let fixture = try Fixture()
        try fixture.session("s1", ["discretionary": true])
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "cellular"]).0 == 200)
        let file = fixture.makeFile("a.bin", size: 700_000)
        let first = try fixture.enqueue(file)
        _ = try waitFor(fixture, first, "waiting", "discretionary_deferred")
        #expect(try fixture.daemon.call("PUT", "/v1/policy", ["discretionary_daily_budget": ["wifi": 1_000_000]]).0 == 200)
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "wifi"]).0 == 200)
        #expect(try fixture.daemon.waitForTask(first)["state"]?.stringValue == "completed")
        #expect(try fixture.daemon.waitForTask(try fixture.enqueue(file))["state"]?.stringValue == "completed")
        let third = try fixture.enqueue(file)
        _ = try waitFor(fixture, third, "waiting", "budget_exhausted")
        // A larger budget takes effect at once.
        #expect(try fixture.daemon.call("PUT", "/v1/policy", ["discretionary_daily_budget": ["wifi": 10_000_000]]).0 == 200)
        #expect(try fixture.daemon.waitForTask(third)["state"]?.stringValue == "completed")
        // What was spent today survives a restart.
        fixture.daemon.kill9()
        try fixture.daemon.start()
        #expect(try fixture.daemon.call("PUT", "/v1/policy", ["discretionary_daily_budget": ["wifi": 2_000_000]]).0 == 200)
        let fourth = try fixture.enqueue(file)
        _ = try waitFor(fixture, fourth, "waiting", "budget_exhausted")
    }

    @Test("bandwidth: a 2 MiB/s limit makes a 10 MiB upload take 5 s ± 20%")
    func bandwidthLimit() throws {
        let fixture = try Fixture()
        try fixture.session()
        #expect(
            try fixture.daemon.call("PUT", "/v1/policy", ["bandwidth_limit": 2_097_152]).1["bandwidth_limit"]?.intValue
                == 2_097_152)
        let file = fixture.makeFile("ten.bin", size: 10 * 1024 * 1024)
        let started = Date()
        let task = try fixture.daemon.waitForTask(try fixture.enqueue(file), timeout: 30)
        let took = Date().timeIntervalSince(started)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(took > 4 && took < 6, "10 MiB at 2 MiB/s took \(took) s")
        print(
            "bandwidth: 10 MiB at a 2 MiB/s limit took \(String(format: "%.2f", took)) s (ideal 5 s, error \(String(format: "%+.1f", (took / 5 - 1) * 100))%)"
        )
        #expect(Bytes(fixture.sink.requests.last?.body) == Bytes(fixture.contents(file)))
    }

    @Test("cancellation reasons: 1 when the service turns transfers off, 2 past a session's quota")
    func serviceSwitchAndQuota() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 1_000_000, then: .respond(status: 201)))
        try fixture.session("s1", ["quota_bytes": 3_000_000])
        let big = fixture.makeFile("big.bin", size: 2_000_000)
        let first = try fixture.enqueue(big)
        let (_, second) = try fixture.daemon.call(
            "POST", "/v1/sessions/s1/tasks",
            [
                "file": .string(big), "request": ["url": .string(fixture.sink.url("/q")), "method": "PUT"],
            ])
        #expect(second["state"]?.stringValue == "cancelled")
        #expect(second["cancellation"]?["reason_code"]?.intValue == 2)
        #expect(second["cancellation"]?["reason"]?.stringValue == "insufficient_system_resources")
        _ = try waitFor(fixture, first, "running")
        let policy = try fixture.daemon.call("PUT", "/v1/policy", ["transfers_enabled": false])
        #expect(policy.0 == 200 && policy.1["transfers_enabled"]?.boolValue == false)
        let cancelled = try fixture.daemon.waitForTask(first)
        #expect(cancelled["state"]?.stringValue == "cancelled" && cancelled["cancellation"]?["reason_code"]?.intValue == 1)
        let refused = try fixture.daemon.call(
            "POST", "/v1/sessions/s1/tasks",
            [
                "file": .string(big), "request": ["url": .string(fixture.sink.url("/q")), "method": "PUT"],
            ])
        #expect(refused.0 == 409 && refused.1["code"]?.stringValue == "transfers_disabled")
        #expect(try fixture.daemon.call("DELETE", "/v1/policy").1["transfers_enabled"]?.boolValue == true)
        #expect(try fixture.daemon.waitForTask(try fixture.enqueue(big))["state"]?.stringValue == "completed")
    }
}

extension EndToEndTests {
    @Test(
        "/metrics parses with the Prometheus client library and shows the policy: waiting reasons, network, stops, bytes, budgets"
    )
    func policyMetrics() throws {
        let fixture = try Fixture(sink: .throttle(bytesPerSecond: 4_000_000, then: .respond(status: 201)))
        try fixture.session("s1", ["allows_cellular_access": false])
        #expect(
            try fixture.daemon.call(
                "PUT", "/v1/policy", ["bandwidth_limit": 8_000_000, "discretionary_daily_budget": ["wired": 5000]]
            ).0 == 200)
        let file = fixture.makeFile("m.bin", size: 16 * 1024 * 1024)
        let id = try fixture.enqueue(file)
        try #require(eventually(timeout: 20) { fixture.sink.totalBodyBytes > 1_000_000 })
        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "cellular"]).0 == 200)
        _ = try waitFor(fixture, id, "waiting", "cellular_not_allowed")
        let exchange = try HTTPClient().send("GET", "http://127.0.0.1:\(fixture.daemon.port)/metrics")
        #expect(exchange.status == 200)
        let samples = try PrometheusParser.parse(String(decoding: exchange.body, as: UTF8.self))
        #expect(samples["backhaul_tasks{state=waiting}"] == 1)
        #expect(samples["backhaul_tasks_waiting{reason=cellular_not_allowed}"] == 1)
        #expect(samples["backhaul_network_info{constrained=false,expensive=true,source=override,type=cellular}"] == 1)
        #expect(samples["backhaul_policy_stops_total{reason=cellular_not_allowed}"] == 1)
        #expect((samples["backhaul_sent_bytes_total{network_type=wired}"] ?? 0) > 1_000_000)
        // Every byte went over the wired network: the transfer stopped when the network changed,
        // and what it sent since the last progress round counts where it was sent.
        #expect((samples["backhaul_sent_bytes_total{network_type=cellular}"] ?? 0) == 0)
        #expect(samples["backhaul_bandwidth_limit_bytes_per_second{}"] == 8_000_000)
        #expect(samples["backhaul_discretionary_budget_remaining_bytes{network_type=wired}"] == 5000)
        #expect(samples["backhaul_retries_total{reason=http_5xx}"] == 0)
        #expect(samples["backhaul_webhook_deliveries{state=pending}"] == 0)
        // API requests by route pattern (bounded labels) with latency histograms.
        #expect((samples["backhaul_http_requests_total{method=GET,route=/v1/tasks/{id},status=200}"] ?? 0) >= 1)
        #expect(samples["backhaul_http_requests_total{method=PUT,route=/v1/network,status=200}"] == 1)
        let bucket = samples["backhaul_http_request_duration_seconds_bucket{le=+Inf,route=/v1/tasks/{id}}"] ?? 0
        #expect(bucket >= 1 && bucket == samples["backhaul_http_request_duration_seconds_count{route=/v1/tasks/{id}}"])
    }
}
