import BackhaulTesting
import Foundation
import JSONCodec
import Testing

/// A private system bus (dbus-daemon) with python-dbusmock's NetworkManager and ModemManager,
/// driven by `Tests/peers/network-bus.py` one command at a time.
final class NetworkBus {
    let process = Process()
    let input = Pipe()
    let output = Pipe()
    var address = ""
    private var buffer: [UInt8] = []

    init(directory: String) throws {
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = [PythonPeer.script("network-bus.py"), "--dir", directory]
        process.standardInput = input
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let line = try readLine()
        guard line.hasPrefix("address ") else { throw NetworkBusError(message: "network-bus.py: \(line)") }
        address = String(line.dropFirst("address ".count))
    }

    /// The peer ends its bus when its input closes; one that does not within 10 s is killed
    /// (its bus and mocks then stay until the machine's next cleanup: the test says so).
    deinit {
        try? input.fileHandleForWriting.close()
        if !eventually(timeout: 10, { !process.isRunning }) {
            print("network-bus.py did not end: killed")
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    private func readLine() throws -> String {
        while true {
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffer[..<newline], as: UTF8.self)
                buffer.removeSubrange(...newline)
                return line
            }
            let data = output.fileHandleForReading.availableData
            guard !data.isEmpty else { throw NetworkBusError(message: "network-bus.py ended") }
            buffer += data
        }
    }

    /// Sends one command and waits until the bus has it (the property is changed and its
    /// signal sent when this returns).
    func send(_ command: JSON) throws {
        input.fileHandleForWriting.write(Data((command.serialized() + "\n").utf8))
        let answer = try readLine()
        guard answer == "ok" else { throw NetworkBusError(message: "network-bus.py: \(answer)") }
    }
}

struct NetworkBusError: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}

extension EndToEndTests {
    /// A daemon following NetworkManager on `bus` (started again with the bus's address).
    func networkManagerFixture(
        _ bus: NetworkBus, sink: RecordingSink.Behaviour = .respond(status: 201, body: "{\"ok\":true}")
    ) throws -> Fixture {
        let fixture = try Fixture(daemonArguments: ["--network-source", "auto"], sink: sink)
        fixture.daemon.environment = ["DBUS_SYSTEM_BUS_ADDRESS": bus.address]
        _ = fixture.daemon.terminate()
        try fixture.daemon.start()
        return fixture
    }

    func network(_ fixture: Fixture) -> JSON { (try? fixture.daemon.call("GET", "/v1/network").1) ?? .null }

    /// Seconds until the network reads `check` (polled every 10 ms).
    func untilNetwork(_ fixture: Fixture, timeout: Double = 5, _ check: (JSON) -> Bool) -> Double? {
        let started = Date()
        guard eventually(timeout: timeout, interval: 0.01, { check(network(fixture)) }) else { return nil }
        return Date().timeIntervalSince(started)
    }

    @Test(
        "NetworkManager: a Wi-Fi turning metered stops an upload that may not use an expensive network within 1 s; unmetered, it resumes from its offset"
    )
    func networkManagerMeteredWifi() throws {
        let scratch = TemporaryDirectory("nm-bus")
        let bus = try NetworkBus(directory: scratch.path)
        try bus.send(["op": "connect", "type": "802-11-wireless", "device_type": 2, "interface": "wlan0", "metered": 4])
        let fixture = try networkManagerFixture(bus, sink: .throttle(bytesPerSecond: 4_000_000, then: .resumable))
        #expect(
            untilNetwork(fixture) { $0["source"]?.stringValue == "networkmanager" && $0["type"]?.stringValue == "wifi" } != nil,
            "\(network(fixture).serialized())")
        #expect(network(fixture)["interface"]?.stringValue == "wlan0" && network(fixture)["expensive"]?.boolValue == false)
        try fixture.session("s1", ["allows_expensive_network_access": false])
        let size = 24 * 1024 * 1024
        let file = fixture.makeFile("video.bin", size: size)
        let id = try fixture.enqueue(file, path: "/v", extra: ["upload": ["protocol": "chunked", "chunk_size": 1_048_576]])
        try #require(eventually(timeout: 20) { fixture.sink.totalBodyBytes > 3_000_000 })
        try bus.send(["op": "set", "object": "device", "name": "Metered", "value": 1])
        let took = try waitFor(fixture, id, "waiting", "expensive_network_not_allowed")
        #expect(took < 1.0, "stopped after \(took) s")
        print("networkmanager: Metered yes stopped a running upload in \(String(format: "%.3f", took)) s")
        try bus.send(["op": "set", "object": "device", "name": "Metered", "value": 2])
        let resumed = try waitFor(fixture, id, "running", nil)
        print("networkmanager: Metered no resumed it in \(String(format: "%.3f", resumed)) s")
        let task = try fixture.daemon.waitForTask(id, timeout: 60)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized())")
        #expect(Bytes(fixture.sink.assembled("/v")) == Bytes(fixture.contents(file)))
        let resent = fixture.sink.totalBodyBytes - Int64(size)
        #expect(resent < 2 * 1_048_576, "re-sent \(resent) bytes")
    }

    @Test(
        "NetworkManager and ModemManager: gsm reads cellular, EDGE constrained, roaming holds allows_roaming false, a portal holds with limited_connectivity, an override wins, leaving the bus falls back and its return is followed"
    )
    func networkManagerCellular() throws {
        let scratch = TemporaryDirectory("nm-bus")
        let bus = try NetworkBus(directory: scratch.path)
        try bus.send([
            "op": "connect", "type": "gsm", "device_type": 8, "interface": "wwan0", "modem": true, "access": 16384,
        ])
        let fixture = try networkManagerFixture(bus)
        #expect(
            untilNetwork(fixture) {
                $0["source"]?.stringValue == "networkmanager" && $0["type"]?.stringValue == "cellular"
                    && $0["expensive"]?.boolValue == true && $0["constrained"]?.boolValue == false
                    && $0["connectivity"]?.stringValue == "full"
            } != nil, "\(network(fixture).serialized())")

        try bus.send(["op": "set", "object": "modem", "name": "AccessTechnologies", "value": 16])
        let edge = untilNetwork(fixture) { $0["constrained"]?.boolValue == true }
        #expect(edge.map { $0 < 1 } == true, "EDGE: \(network(fixture).serialized())")
        print("networkmanager: EDGE read as constrained in \(String(format: "%.3f", edge ?? -1)) s")
        try bus.send(["op": "set", "object": "modem", "name": "AccessTechnologies", "value": 16384])

        try fixture.session("s1", ["allows_roaming": false])
        try fixture.session("s2")
        #expect(try fixture.daemon.call("PATCH", "/v1/sessions/s1", ["enabled": false]).0 == 200)
        let file = fixture.makeFile("a.bin", size: 100_000)
        let held = try fixture.enqueue(file, path: "/held")
        #expect(try fixture.daemon.call("PATCH", "/v1/sessions/s1", ["enabled": true]).0 == 200)
        #expect(try fixture.daemon.waitForTask(held)["state"]?.stringValue == "completed")
        let roamer = try fixture.enqueue(file, path: "/roamer", extra: ["configuration": ["allows_roaming": false]])
        _ = try fixture.daemon.waitForTask(roamer)
        try bus.send(["op": "set", "object": "modem3gpp", "name": "RegistrationState", "value": 5])
        let roaming = untilNetwork(fixture) { $0["roaming"]?.boolValue == true }
        print("networkmanager: roaming read in \(String(format: "%.3f", roaming ?? -1)) s")
        let second = try fixture.enqueue(file, path: "/roaming")
        let held2 = try waitFor(fixture, second, "waiting", "roaming_not_allowed")
        print("networkmanager: a task with allows_roaming false held in \(String(format: "%.3f", held2)) s")
        try bus.send(["op": "set", "object": "modem3gpp", "name": "RegistrationState", "value": 1])
        #expect(try fixture.daemon.waitForTask(second)["state"]?.stringValue == "completed")

        try bus.send(["op": "set", "object": "manager", "name": "Connectivity", "value": 2])
        // The task goes in once the daemon reads the portal (a task enqueued before could start
        // and finish on the network as it was).
        let portal = untilNetwork(fixture) { $0["connectivity"]?.stringValue == "portal" }
        #expect(portal.map { $0 < 1 } == true, "portal: \(network(fixture).serialized())")
        print("networkmanager: a portal read in \(String(format: "%.3f", portal ?? -1)) s")
        let started = Date()
        let portalTask = try fixture.enqueue(file, path: "/portal", session: "s2")
        _ = try waitFor(fixture, portalTask, "waiting", "limited_connectivity")
        print("networkmanager: a portal held a task in \(String(format: "%.3f", Date().timeIntervalSince(started))) s")

        #expect(try fixture.daemon.call("PUT", "/v1/network", ["type": "wired"]).0 == 200)
        #expect(network(fixture)["source"]?.stringValue == "override")
        #expect(try fixture.daemon.waitForTask(portalTask)["state"]?.stringValue == "completed")
        #expect(try fixture.daemon.call("DELETE", "/v1/network").1["source"]?.stringValue == "networkmanager")
        try bus.send(["op": "set", "object": "manager", "name": "Connectivity", "value": 4])

        try bus.send(["op": "stop-nm"])
        let gone = untilNetwork(fixture) { $0["source"]?.stringValue == "routing_table" }
        #expect(gone.map { $0 < 1 } == true, "after NetworkManager left: \(network(fixture).serialized())")
        print("networkmanager: leaving the bus fell back to the routing table in \(String(format: "%.3f", gone ?? -1)) s")
        #expect(network(fixture)["type"]?.stringValue == "wired")
        try bus.send(["op": "start-nm"])
        let back = untilNetwork(fixture) {
            $0["source"]?.stringValue == "networkmanager" && $0["type"]?.stringValue == "cellular"
        }
        #expect(back.map { $0 < 1 } == true, "after NetworkManager came back: \(network(fixture).serialized())")
        print("networkmanager: its return was followed in \(String(format: "%.3f", back ?? -1)) s")
    }

    @Test(
        "NetworkManager: a property of the wrong type falls back for that field with one log line; a bus that stops answering blocks neither the start, the API nor the transfers"
    )
    func networkManagerBadInput() throws {
        let scratch = TemporaryDirectory("nm-bus")
        let bus = try NetworkBus(directory: scratch.path)
        try bus.send(["op": "connect", "type": "802-11-wireless", "device_type": 2, "interface": "wlan0", "metered": 4])
        let fixture = try networkManagerFixture(bus)
        #expect(
            untilNetwork(fixture) { $0["source"]?.stringValue == "networkmanager" && $0["type"]?.stringValue == "wifi" } != nil)

        // Metered as a string: that field falls back (the manager's, unknown: wifi is not expensive).
        try bus.send(["op": "set", "object": "device", "name": "Metered", "value": ["string": "yes"]])
        try bus.send(["op": "set", "object": "device", "name": "Interface", "value": "wlan1"])
        #expect(untilNetwork(fixture) { $0["interface"]?.stringValue == "wlan1" } != nil, "\(network(fixture).serialized())")
        #expect(network(fixture)["expensive"]?.boolValue == false && network(fixture)["source"]?.stringValue == "networkmanager")
        try bus.send(["op": "set", "object": "device", "name": "Interface", "value": "wlan2"])
        #expect(untilNetwork(fixture) { $0["interface"]?.stringValue == "wlan2" } != nil)
        let lines = fixture.daemon.log(lastLines: 100_000).split(separator: "\n").filter {
            $0.contains("of another type") && $0.contains("\"dbus.property\":\"Metered\"")
        }
        #expect(lines.count == 1, "\(lines)")

        // NetworkManager stops answering: the daemon still starts, answers and uploads.
        try bus.send(["op": "freeze-nm"])
        #expect(fixture.daemon.terminate() == 0)
        let started = Date()
        try fixture.daemon.start()
        print(
            "networkmanager: started beside a NetworkManager that does not answer in \(String(format: "%.3f", Date().timeIntervalSince(started))) s"
        )
        #expect(Date().timeIntervalSince(started) < 10)
        for _ in 0..<5 {
            let asked = Date()
            _ = try fixture.daemon.call("GET", "/v1/network", timeout: 5)
            #expect(Date().timeIntervalSince(asked) < 1, "GET /v1/network waited for the bus")
        }
        try fixture.session("s1")
        let id = try fixture.enqueue(fixture.makeFile("a.bin", size: 10_000), path: "/frozen")
        #expect(try fixture.daemon.waitForTask(id)["state"]?.stringValue == "completed")
        #expect(untilNetwork(fixture, timeout: 10) { $0["source"]?.stringValue == "routing_table" } != nil)
        try bus.send(["op": "thaw-nm"])
        try bus.send(["op": "set", "object": "device", "name": "Interface", "value": "wlan3"])
        #expect(untilNetwork(fixture, timeout: 10) { $0["source"]?.stringValue == "networkmanager" } != nil)
    }
}
