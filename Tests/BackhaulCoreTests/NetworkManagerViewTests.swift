import BackhaulCore
import JSONCodec
import Testing

/// NetworkManager's and ModemManager's properties in, the network view out (docs/network.md); and what
/// the policy decides on roaming and limited connectivity.
@Suite("NetworkManager mapping")
struct NetworkManagerViewTests {
    struct Row: Sendable, CustomTestStringConvertible {
        var name: String
        var reading: NetworkManagerReading
        var expected: NetworkState
        var testDescription: String { name }
    }

    static let connection = "/org/freedesktop/NetworkManager/ActiveConnection/1"
    static func view(
        _ type: NetworkType, _ interface: String? = nil, expensive: Bool = false, constrained: Bool = false,
        roaming: Bool = false,
        connectivity: Connectivity = .full
    ) -> NetworkState {
        NetworkState(
            type: type, interface: interface, expensive: expensive, constrained: constrained, roaming: roaming,
            connectivity: connectivity, source: .networkManager)
    }
    static func reading(
        _ type: String?, devices: [UInt32] = [], interface: String? = nil, deviceMetered: UInt32? = nil,
        managerMetered: UInt32? = nil, connectivity: UInt32? = 4, modem: ModemReading? = nil
    ) -> NetworkManagerReading {
        NetworkManagerReading(
            primaryConnection: connection, connectionType: type, deviceTypes: devices, interface: interface,
            deviceMetered: deviceMetered, managerMetered: managerMetered, connectivity: connectivity, modem: modem)
    }

    static let rows: [Row] = [
        Row(
            name: "no primary connection: none", reading: NetworkManagerReading(primaryConnection: "/", connectivity: 1),
            expected: view(.none, connectivity: .none)),
        Row(
            name: "the manager not read at all: none", reading: NetworkManagerReading(),
            expected: view(.none, connectivity: .none)),
        Row(
            name: "ethernet", reading: reading("802-3-ethernet", devices: [1], interface: "eth0"), expected: view(.wired, "eth0")),
        Row(name: "wifi, metered unknown", reading: reading("802-11-wireless", devices: [2]), expected: view(.wifi)),
        Row(
            name: "wifi, device metered yes", reading: reading("802-11-wireless", devices: [2], deviceMetered: 1),
            expected: view(.wifi, expensive: true)),
        Row(
            name: "wifi, device metered guess-yes", reading: reading("802-11-wireless", deviceMetered: 3),
            expected: view(.wifi, expensive: true)),
        Row(
            name: "wifi, device unknown, manager metered yes",
            reading: reading("802-11-wireless", deviceMetered: 0, managerMetered: 1),
            expected: view(.wifi, expensive: true)),
        Row(
            name: "wifi, device metered no wins over the manager's yes",
            reading: reading("802-11-wireless", deviceMetered: 2, managerMetered: 1), expected: view(.wifi)),
        Row(name: "gsm: cellular, expensive by default", reading: reading("gsm"), expected: view(.cellular, expensive: true)),
        Row(name: "cdma: cellular", reading: reading("cdma"), expected: view(.cellular, expensive: true)),
        Row(
            name: "a modem device under an unknown type: cellular", reading: reading("vpn", devices: [8]),
            expected: view(.cellular, expensive: true)),
        Row(
            name: "cellular metered guess-no: not expensive", reading: reading("gsm", deviceMetered: 4),
            expected: view(.cellular)),
        Row(
            name: "bluetooth: other and expensive (a tethered phone)",
            reading: reading("bluetooth", devices: [5], deviceMetered: 4),
            expected: view(.other, expensive: true)),
        Row(name: "vpn without devices: other", reading: reading("vpn"), expected: view(.other)),
        Row(name: "no type, a wifi device: wifi", reading: reading(nil, devices: [2]), expected: view(.wifi)),
        Row(
            name: "roaming (5): roaming and expensive even when metered no",
            reading: reading("gsm", deviceMetered: 2, modem: ModemReading(registrationState: 5, accessTechnologies: 1 << 14)),
            expected: view(.cellular, expensive: true, roaming: true)),
        Row(
            name: "roaming SMS-only (7)", reading: reading("gsm", modem: ModemReading(registrationState: 7)),
            expected: view(.cellular, expensive: true, roaming: true)),
        Row(
            name: "roaming CSFB not preferred (10)", reading: reading("gsm", modem: ModemReading(registrationState: 10)),
            expected: view(.cellular, expensive: true, roaming: true)),
        Row(
            name: "home (1): not roaming", reading: reading("gsm", modem: ModemReading(registrationState: 1)),
            expected: view(.cellular, expensive: true)),
        Row(
            name: "EDGE only: constrained",
            reading: reading("gsm", modem: ModemReading(registrationState: 1, accessTechnologies: 1 << 4)),
            expected: view(.cellular, expensive: true, constrained: true)),
        Row(
            name: "GPRS and 1xRTT: constrained",
            reading: reading("gsm", modem: ModemReading(accessTechnologies: 1 << 3 | 1 << 10)),
            expected: view(.cellular, expensive: true, constrained: true)),
        Row(
            name: "EDGE and UMTS: not constrained",
            reading: reading("gsm", modem: ModemReading(accessTechnologies: 1 << 4 | 1 << 5)),
            expected: view(.cellular, expensive: true)),
        Row(
            name: "LTE: not constrained", reading: reading("gsm", modem: ModemReading(accessTechnologies: 1 << 14)),
            expected: view(.cellular, expensive: true)),
        Row(
            name: "technologies unknown (0): not constrained",
            reading: reading("gsm", modem: ModemReading(accessTechnologies: 0)),
            expected: view(.cellular, expensive: true)),
        Row(
            name: "a modem's roaming on a wifi connection does not count",
            reading: reading("802-11-wireless", modem: ModemReading(registrationState: 5, accessTechnologies: 1 << 4)),
            expected: view(.wifi)),
        Row(
            name: "connectivity portal", reading: reading("802-11-wireless", connectivity: 2),
            expected: view(.wifi, connectivity: .portal)),
        Row(
            name: "connectivity limited", reading: reading("802-11-wireless", connectivity: 3),
            expected: view(.wifi, connectivity: .limited)),
        Row(
            name: "connectivity none", reading: reading("802-3-ethernet", connectivity: 1),
            expected: view(.wired, connectivity: .none)),
        Row(
            name: "connectivity unknown (checks disabled)", reading: reading("802-3-ethernet", connectivity: 0),
            expected: view(.wired, connectivity: .unknown)),
        Row(
            name: "connectivity not read: unknown", reading: reading("802-3-ethernet", connectivity: nil),
            expected: view(.wired, connectivity: .unknown)),
    ]

    @Test("properties in, the network view out", arguments: rows)
    func mapping(_ row: Row) {
        #expect(row.reading.network(classifier: NetworkClassifier()) == row.expected)
    }

    struct PolicyRow: Sendable, CustomTestStringConvertible {
        var name: String
        var overrides: JSON
        var network: NetworkState
        var expected: PolicyDecision
        var testDescription: String { name }
    }

    static let roaming = view(.cellular, expensive: true, roaming: true)
    static let portal = view(.wifi, connectivity: .portal)
    static let limited = view(.wifi, connectivity: .limited)

    static let policyRows: [PolicyRow] = [
        PolicyRow(name: "roaming allowed by default: run", overrides: [:], network: roaming, expected: .run),
        PolicyRow(
            name: "roaming not allowed: wait", overrides: ["allows_roaming": false], network: roaming,
            expected: .wait(.roamingNotAllowed)),
        PolicyRow(
            name: "roaming not allowed, whatever allows_expensive_network_access says",
            overrides: ["allows_roaming": false, "allows_expensive_network_access": true], network: roaming,
            expected: .wait(.roamingNotAllowed)),
        PolicyRow(
            name: "roaming not allowed, may not wait: -1020",
            overrides: ["allows_roaming": false, "waits_for_connectivity": false],
            network: roaming,
            expected: .fail(TaskError(.dataNotAllowed, message: "the network is roaming and allows_roaming is false"))),
        PolicyRow(
            name: "roaming allowed, expensive not: the expensive rule holds it",
            overrides: ["allows_expensive_network_access": false], network: roaming, expected: .wait(.expensiveNetworkNotAllowed)),
        PolicyRow(
            name: "roaming not allowed, at home: run", overrides: ["allows_roaming": false],
            network: view(.cellular, expensive: true), expected: .run),
        PolicyRow(name: "portal: wait", overrides: [:], network: portal, expected: .wait(.limitedConnectivity)),
        PolicyRow(name: "limited: wait", overrides: [:], network: limited, expected: .wait(.limitedConnectivity)),
        PolicyRow(
            name: "portal, may not wait: -1009", overrides: ["waits_for_connectivity": false], network: portal,
            expected: .fail(
                TaskError(
                    .notConnectedToInternet, message: "the network's connectivity is portal and waits_for_connectivity is false"))
        ),
        PolicyRow(
            name: "connectivity none: no_connectivity", overrides: [:], network: view(.wired, connectivity: .none),
            expected: .wait(.noConnectivity)),
        PolicyRow(
            name: "connectivity unknown is not offline", overrides: [:], network: view(.wired, connectivity: .unknown),
            expected: .run),
        PolicyRow(
            name: "limited connectivity comes before roaming", overrides: ["allows_roaming": false],
            network: view(.cellular, expensive: true, roaming: true, connectivity: .limited),
            expected: .wait(.limitedConnectivity)),
    ]

    @Test("roaming and limited connectivity in the policy", arguments: policyRows)
    func policy(_ row: PolicyRow) throws {
        let configuration = try TransferConfiguration().applying(row.overrides)
        #expect(Policy.decide(configuration, in: PolicyContext(network: row.network)) == row.expected)
    }

    @Test("allows_roaming: default true, read, shown, and PATCHed over a session's")
    func allowsRoamingKey() throws {
        #expect(TransferConfiguration().allowsRoaming)
        let session = try TransferConfiguration().applying(["allows_roaming": false])
        #expect(!session.allowsRoaming && session.json["allows_roaming"]?.boolValue == false)
        #expect(try session.applying(["allows_roaming": true]).allowsRoaming)
        #expect(try TransferConfiguration().applying(session.json) == session)
        #expect(throws: ValidationError.self) { try TransferConfiguration().applying(["allows_roaming": "no"]) }
    }

    @Test("override: roaming and connectivity are read; roaming makes it expensive by default; stored form reads back")
    func override() throws {
        let classifier = NetworkClassifier()
        let state = try NetworkState.decodeOverride(
            ["type": "cellular", "roaming": true, "connectivity": "portal"], classifier: classifier)
        #expect(state.roaming && state.expensive && state.connectivity == .portal && state.source == .override)
        let wifi = try NetworkState.decodeOverride(["type": "wifi", "roaming": true], classifier: classifier)
        #expect(wifi.expensive && wifi.connectivity == .unknown)
        #expect(try NetworkState.decodeOverride(["type": "none"], classifier: classifier).connectivity == .none)
        #expect(try NetworkState.decodeOverride(state.overrideJSON, classifier: classifier) == state)
        #expect(throws: ValidationError.self) {
            try NetworkState.decodeOverride(["type": "wifi", "connectivity": "great"], classifier: classifier)
        }
        #expect(state.json["source"]?.stringValue == "override" && state.json["connectivity"]?.stringValue == "portal")
    }
}
