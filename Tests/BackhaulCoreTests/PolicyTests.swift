import BackhaulCore
import JSONCodec
import Testing

@Suite("Policy decisions")
struct PolicyTests {
    static let wifi = NetworkState(type: .wifi, interface: "wlan0")
    static let wired = NetworkState(type: .wired, interface: "eth0")
    static let cellular = NetworkState(type: .cellular, interface: "wwan0", expensive: true)
    static let expensiveWifi = NetworkState(type: .wifi, interface: "wlan1", expensive: true)
    static let constrainedWired = NetworkState(type: .wired, interface: "eth1", constrained: true)
    static let none = NetworkState.disconnected

    /// A configuration from JSON overrides of the defaults.
    static func configuration(_ overrides: JSON) -> TransferConfiguration {
        try! TransferConfiguration().applying(overrides)
    }

    struct Row: Sendable, CustomTestStringConvertible {
        var name: String
        var overrides: JSON
        var network: NetworkState
        var expected: PolicyDecision
        var testDescription: String { name }
    }

    static let noWait: JSON = ["waits_for_connectivity": false]

    static let rows: [Row] = [
        Row(name: "defaults run on wifi", overrides: [:], network: wifi, expected: .run),
        Row(name: "defaults run on cellular", overrides: [:], network: cellular, expected: .run),
        Row(name: "no network: wait", overrides: [:], network: none, expected: .wait(.noConnectivity)),
        Row(
            name: "no network, may not wait: -1009", overrides: noWait, network: none,
            expected: .fail(
                TaskError(.notConnectedToInternet, message: "no network is connected and waits_for_connectivity is false"))),
        Row(
            name: "cellular not allowed: wait", overrides: ["allows_cellular_access": false], network: cellular,
            expected: .wait(.cellularNotAllowed)),
        Row(
            name: "cellular not allowed, may not wait: -1020",
            overrides: ["allows_cellular_access": false, "waits_for_connectivity": false], network: cellular,
            expected: .fail(TaskError(.dataNotAllowed, message: "the network is cellular and allows_cellular_access is false"))),
        Row(
            name: "cellular not allowed, on wifi: run", overrides: ["allows_cellular_access": false], network: wifi,
            expected: .run),
        Row(
            name: "expensive not allowed, on cellular: wait", overrides: ["allows_expensive_network_access": false],
            network: cellular,
            expected: .wait(.expensiveNetworkNotAllowed)),
        Row(
            name: "expensive not allowed, on expensive wifi: wait", overrides: ["allows_expensive_network_access": false],
            network: expensiveWifi, expected: .wait(.expensiveNetworkNotAllowed)),
        Row(
            name: "expensive not allowed, may not wait: -1020",
            overrides: ["allows_expensive_network_access": false, "waits_for_connectivity": false], network: expensiveWifi,
            expected: .fail(
                TaskError(.dataNotAllowed, message: "the network is expensive and allows_expensive_network_access is false"))),
        Row(
            name: "expensive not allowed, on wired: run", overrides: ["allows_expensive_network_access": false], network: wired,
            expected: .run),
        Row(
            name: "constrained not allowed: wait", overrides: ["allows_constrained_network_access": false],
            network: constrainedWired,
            expected: .wait(.constrainedNetworkNotAllowed)),
        Row(
            name: "constrained not allowed, may not wait: -1020",
            overrides: ["allows_constrained_network_access": false, "waits_for_connectivity": false], network: constrainedWired,
            expected: .fail(
                TaskError(
                    .dataNotAllowed,
                    message: "the network is constrained and allows_constrained_network_access is false"))),
        Row(name: "constrained allowed: run", overrides: [:], network: constrainedWired, expected: .run),
        Row(
            name: "discretionary on cellular: deferred", overrides: ["discretionary": true], network: cellular,
            expected: .wait(.discretionaryDeferred)),
        Row(
            name: "discretionary on expensive wifi: deferred", overrides: ["discretionary": true], network: expensiveWifi,
            expected: .wait(.discretionaryDeferred)),
        Row(
            name: "discretionary on constrained: deferred, even if it may not wait",
            overrides: [
                "discretionary": true,
                "waits_for_connectivity": false,
            ], network: constrainedWired, expected: .wait(.discretionaryDeferred)),
        Row(name: "discretionary on wifi: run", overrides: ["discretionary": true], network: wifi, expected: .run),
    ]

    @Test("network and configuration", arguments: rows)
    func table(_ row: Row) {
        #expect(Policy.decide(Self.configuration(row.overrides), in: PolicyContext(network: row.network)) == row.expected)
    }

    @Test("discretionary: inside the window, within the budget of the network type")
    func discretionaryWindowAndBudget() throws {
        let policy = try ServicePolicy().applying([
            "discretionary_window": ["from": "22:00", "to": "06:00"],
            "discretionary_daily_budget": ["wifi": 1000],
        ])
        let discretionary = Self.configuration(["discretionary": true])
        func decide(minute: Int, used: Int64, network: NetworkState = Self.wifi) -> PolicyDecision {
            Policy.decide(
                discretionary, in: PolicyContext(network: network, policy: policy, minuteOfDay: minute, budgetUsed: [.wifi: used])
            )
        }
        #expect(decide(minute: 23 * 60, used: 0) == .run)
        #expect(decide(minute: 3 * 60, used: 999) == .run)
        #expect(decide(minute: 6 * 60, used: 0) == .wait(.discretionaryDeferred))
        #expect(decide(minute: 12 * 60, used: 0) == .wait(.discretionaryDeferred))
        #expect(decide(minute: 23 * 60, used: 1000) == .wait(.budgetExhausted))
        // No budget for wired: unlimited there.
        #expect(decide(minute: 23 * 60, used: 5000, network: Self.wired) == .run)
        // Not discretionary: neither window nor budget applies.
        #expect(
            Policy.decide(
                TransferConfiguration(),
                in: PolicyContext(
                    network: Self.wifi, policy: policy, minuteOfDay: 12 * 60,
                    budgetUsed: [.wifi: 5000])) == .run)
    }

    @Test("earliest_begin_at and the per-host limit")
    func scheduledAndHostLimit() {
        let context = PolicyContext(network: Self.wifi, now: 100)
        #expect(Policy.decide(TransferConfiguration(), earliestBeginAt: 150, in: context) == .wait(.scheduled))
        #expect(Policy.decide(TransferConfiguration(), earliestBeginAt: 100, in: context) == .run)
        #expect(Policy.decide(TransferConfiguration(), hostSlotFree: false, in: context) == .wait(.hostConnectionLimit))
        // A forbidden network wins over a full host.
        #expect(
            Policy.decide(
                Self.configuration(["allows_cellular_access": false]), hostSlotFree: false,
                in: PolicyContext(network: Self.cellular)) == .wait(.cellularNotAllowed))
    }

    @Test("bandwidth: the smallest limit that applies; edges of windows and of the day")
    func bandwidth() throws {
        let policy = try ServicePolicy().applying([
            "bandwidth_limit": 1_000_000, "bandwidth_limit_by_network": ["cellular": 200_000],
            "bandwidth_schedule": [["from": "08:00", "to": "18:00", "limit": 500_000]],
        ])
        #expect(policy.bandwidth(minuteOfDay: 7 * 60, network: .wifi) == 1_000_000)
        #expect(policy.bandwidth(minuteOfDay: 9 * 60, network: .wifi) == 500_000)
        #expect(policy.bandwidth(minuteOfDay: 9 * 60, network: .cellular) == 200_000)
        #expect(ServicePolicy().bandwidth(minuteOfDay: 0, network: .wifi) == nil)
        #expect(policy.minutesToNextEdge(minuteOfDay: 7 * 60) == 60)
        #expect(policy.minutesToNextEdge(minuteOfDay: 19 * 60) == 5 * 60)
        #expect(ServicePolicy().minutesToNextEdge(minuteOfDay: 23 * 60 + 59) == 1)
        #expect(try ServicePolicy().applying(policy.json) == policy)
    }

    static let invalidPolicies: [(JSON, String)] = [
        (["bandwidth_limit": 10], "policy.bandwidth_limit"),
        (["discretionary_window": ["from": "25:00", "to": "06:00"]], "policy.discretionary_window.from"),
        (["discretionary_window": ["from": "06:00", "to": "06:00"]], "policy.discretionary_window.to"),
        (["discretionary_daily_budget": ["satellite": 5]], "policy.discretionary_daily_budget.satellite"),
        (["bandwidth_schedule": [["from": "01:00", "to": "02:00"]]], "policy.bandwidth_schedule[0].limit"),
        (["speed": 1], "policy.speed"),
        (["discretionary_network_service_type": "bulk"], "policy.discretionary_network_service_type"),
    ]

    /// Rows: the configuration's `network_service_type` (nil: unset), discretionary, the policy's
    /// default for discretionary tasks → how the transfer shares the link.
    @Test(
        "network_service_type: the configuration's when set, else the policy's for a discretionary task, else default",
        arguments: [
            (nil, false, .background, .default), (nil, true, .background, .background), (nil, true, .default, .default),
            (.default, true, .background, .default), (.background, false, .default, .background),
        ] as [(NetworkServiceType?, Bool, NetworkServiceType, NetworkServiceType)])
    func serviceType(
        _ own: NetworkServiceType?, _ discretionary: Bool, _ policyDefault: NetworkServiceType, _ expected: NetworkServiceType
    ) throws {
        var configuration = TransferConfiguration()
        configuration.networkServiceType = own
        configuration.discretionary = discretionary
        let policy = try ServicePolicy().applying(["discretionary_network_service_type": .string(policyDefault.rawValue)])
        #expect(policy.networkServiceType(for: configuration) == expected)
        #expect(try ServicePolicy().applying(policy.json) == policy)
        // The configuration carries it through its JSON; a task's override replaces it, null unsets it.
        #expect(try TransferConfiguration().applying(configuration.json) == configuration)
        let overridden = try configuration.applying(["network_service_type": "background"])
        #expect(overridden.networkServiceType == .background)
        #expect(try overridden.applying(["network_service_type": .null]).networkServiceType == nil)
        #expect(throws: ValidationError.self) { try configuration.applying(["network_service_type": "fast"]) }
    }

    @Test("invalid policies are refused with the field", arguments: invalidPolicies)
    func invalid(_ value: JSON, _ field: String) {
        #expect(throws: ValidationError.self) { try ServicePolicy().applying(value) }
        do { _ = try ServicePolicy().applying(value) } catch { #expect(error.field == field) }
    }
}

@Suite("Network detection")
struct NetworkDetectionTests {
    static let header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"

    @Test("the default route with the lowest metric wins; routes that are down or not default are ignored")
    func defaultRoute() {
        let table =
            Self.header
            + "eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
            + "wwan0\t00000000\t0101A8C0\t0003\t0\t0\t700\t00000000\t0\t0\t0\n"
            + "wlan0\t00000000\t0102A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n"
            + "eth1\t00000000\t0103A8C0\t0002\t0\t0\t1\t00000000\t0\t0\t0\n"
        #expect(NetworkClassifier.defaultInterface(routeTable: table) == "wlan0")
        #expect(NetworkClassifier.defaultInterface(routeTable: Self.header) == nil)
        #expect(NetworkClassifier.defaultInterface(routeTable: "") == nil)
    }

    @Test(
        "classification by name patterns",
        arguments: [
            ("wwan0", NetworkType.cellular, true), ("ppp0", .cellular, true), ("rmnet_data0", .cellular, true),
            ("usb0", .cellular, true),
            ("wlan0", .wifi, false), ("wlp3s0", .wifi, false), ("eth0", .wired, false), ("enp0s31f6", .wired, false),
            ("tun0", .other, false), ("docker0", .other, false),
        ])
    func classify(_ interface: String, _ type: NetworkType, _ expensive: Bool) {
        let state = NetworkClassifier().classify(interface: interface)
        #expect(state.type == type && state.expensive == expensive && !state.constrained && state.interface == interface)
    }

    @Test("no default route is none; patterns and flags come from the config file")
    func configured() throws {
        #expect(NetworkClassifier().classify(interface: nil) == .disconnected)
        var classifier = NetworkClassifier()
        try classifier.apply([
            "cellular_interfaces": ["lte*"], "constrained_interfaces": ["eth9"], "expensive_interfaces": ["eth9"],
            "expensive_types": [],
        ])
        #expect(classifier.classify(interface: "lte0") == NetworkState(type: .cellular, interface: "lte0"))
        #expect(
            classifier.classify(interface: "eth9")
                == NetworkState(type: .wired, interface: "eth9", expensive: true, constrained: true))
        #expect(Glob.matches("w?an*", "wlan0") && !Glob.matches("w?an*", "wlxan0") && Glob.matches("*", ""))
    }

    @Test("an override: cellular is expensive unless said otherwise")
    func override() throws {
        let classifier = NetworkClassifier()
        #expect(
            try NetworkState.decodeOverride(["type": "cellular"], classifier: classifier)
                == NetworkState(type: .cellular, expensive: true, source: .override))
        #expect(
            try NetworkState.decodeOverride(["type": "wifi", "constrained": true, "interface": "wlan0"], classifier: classifier)
                == NetworkState(type: .wifi, interface: "wlan0", constrained: true, source: .override))
        #expect(throws: ValidationError.self) { try NetworkState.decodeOverride(["type": "5g"], classifier: classifier) }
        // What the store keeps reads back the same (an override survives restarts).
        let kept = NetworkState(type: .wifi, interface: "wlan0", expensive: true, constrained: true, source: .override)
        #expect(try NetworkState.decodeOverride(kept.overrideJSON, classifier: classifier) == kept)
    }
}

@Suite("Destination rules")
struct DestinationTests {
    @Test(
        "private, loopback, link-local and other non-public addresses",
        arguments: [
            ("127.0.0.1", true), ("10.1.2.3", true), ("172.16.0.1", true), ("172.31.255.255", true), ("172.32.0.1", false),
            ("192.168.1.1", true), ("169.254.169.254", true), ("100.64.0.1", true), ("0.0.0.0", true), ("224.0.0.1", true),
            ("8.8.8.8", false), ("93.184.216.34", false), ("::1", true), ("::", true), ("fe80::1", true), ("fd12::1", true),
            ("::ffff:10.0.0.1", true), ("::ffff:8.8.8.8", false), ("2001:4860:4860::8888", false), ("example.com", false),
        ])
    func privateAddresses(_ address: String, _ isPrivate: Bool) {
        #expect(DestinationRules.isPrivate(address: address) == isPrivate)
    }

    @Test("host patterns with and without a scheme; private literals when denied")
    func refusals() {
        var rules = DestinationRules()
        #expect(rules.refusal("http://127.0.0.1:9/x", for: .upload) == nil)
        rules.uploadHosts = ["https://*.example.com", "uploads.internal"]
        #expect(rules.refusal("https://eu.example.com/a", for: .upload) == nil)
        #expect(rules.refusal("http://eu.example.com/a", for: .upload) != nil)
        #expect(rules.refusal("http://UPLOADS.internal:8080/a", for: .upload) == nil)
        #expect(rules.refusal("https://example.org/a", for: .upload) != nil)
        #expect(rules.refusal("https://example.org/a", for: .webhook) == nil)
        rules.denyPrivate = true
        #expect(rules.refusal("http://[::1]:80/h", for: .webhook) != nil)
        #expect(rules.refusal("http://169.254.169.254/latest", for: .webhook) != nil)
        #expect(rules.refusal("https://hooks.example/h", for: .webhook) == nil)
    }
}
