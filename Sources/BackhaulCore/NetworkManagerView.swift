/// What NetworkManager and ModemManager publish about the primary connection, as read from the
/// bus (docs/network.md); nil where a property could not be read. `network(classifier:)` is the whole
/// mapping, a pure function.
public struct NetworkManagerReading: Sendable, Equatable {
    /// The manager's `PrimaryConnection` object path; `/` (or nil) means none.
    public var primaryConnection: String?
    /// The active connection's `Type` (else the manager's `PrimaryConnectionType`): `802-3-ethernet`,
    /// `802-11-wireless`, `gsm`, `cdma`, `bluetooth`, `vpn`, …
    public var connectionType: String?
    /// `DeviceType` of each of the connection's devices (1 ethernet, 2 wifi, 5 bluetooth, 8 modem).
    public var deviceTypes: [UInt32]
    /// The first device's `Interface`.
    public var interface: String?
    /// `Metered` of the device, else of the manager (0 unknown, 1 yes, 2 no, 3 guess yes, 4 guess no).
    public var deviceMetered: UInt32?
    public var managerMetered: UInt32?
    /// The manager's `Connectivity` (0 unknown, 1 none, 2 portal, 3 limited, 4 full).
    public var connectivity: UInt32?
    /// The modem behind a cellular connection (its device's `Udi`), when ModemManager has it.
    public var modem: ModemReading?

    public init(
        primaryConnection: String? = nil, connectionType: String? = nil, deviceTypes: [UInt32] = [], interface: String? = nil,
        deviceMetered: UInt32? = nil, managerMetered: UInt32? = nil, connectivity: UInt32? = nil, modem: ModemReading? = nil
    ) {
        self.primaryConnection = primaryConnection
        self.connectionType = connectionType
        self.deviceTypes = deviceTypes
        self.interface = interface
        self.deviceMetered = deviceMetered
        self.managerMetered = managerMetered
        self.connectivity = connectivity
        self.modem = modem
    }

    /// NetworkManager's `NMDeviceType` values the mapping tells apart.
    public enum DeviceType {
        public static let ethernet: UInt32 = 1
        public static let wifi: UInt32 = 2
        public static let bluetooth: UInt32 = 5
        public static let modem: UInt32 = 8
    }

    /// The network view: the type from the connection's `Type`, else its devices'; expensive from
    /// `Metered` (yes or guess-yes; unknown falls back to the classifier's expensive types), and
    /// always for bluetooth (a tethered phone) and roaming; constrained when the modem has only
    /// 2G technologies; connectivity from the manager's check.
    public func network(classifier: NetworkClassifier) -> NetworkState {
        let connectivity = Self.connectivity(self.connectivity)
        guard let primary = primaryConnection, primary != "/" else {
            return NetworkState(type: .none, source: .networkManager)
        }
        let type = self.type
        let roaming = type == .cellular && (modem?.isRoaming ?? false)
        let constrained = type == .cellular && (modem?.isOnly2G ?? false)
        let metered: Bool? =
            switch deviceMetered.flatMap({ $0 == 0 ? nil : $0 }) ?? managerMetered {
            case 1, 3: true
            case 2, 4: false
            default: nil
            }
        let bluetooth = connectionType == "bluetooth" || deviceTypes.contains(DeviceType.bluetooth)
        let expensive = roaming || bluetooth || (metered ?? classifier.expensiveTypes.contains(type))
        return NetworkState(
            type: type, interface: interface, expensive: expensive, constrained: constrained, roaming: roaming,
            connectivity: connectivity, source: .networkManager)
    }

    /// The type the connection reads as (before metering, roaming and connectivity).
    public var type: NetworkType {
        switch connectionType {
        case "gsm", "cdma": return .cellular
        case "802-11-wireless": return .wifi
        case "802-3-ethernet": return .wired
        case "bluetooth": return .other
        default: break
        }
        if deviceTypes.contains(DeviceType.modem) { return .cellular }
        if deviceTypes.contains(DeviceType.wifi) { return .wifi }
        if deviceTypes.contains(DeviceType.ethernet) { return .wired }
        return .other
    }

    static func connectivity(_ value: UInt32?) -> Connectivity {
        switch value {
        case 1: .none
        case 2: .portal
        case 3: .limited
        case 4: .full
        default: .unknown
        }
    }
}

/// What ModemManager says of the modem behind a cellular connection.
public struct ModemReading: Sendable, Equatable {
    /// `Modem3gpp.RegistrationState` (1 home, 5 roaming, 7 roaming SMS-only, 10 roaming
    /// CSFB-not-preferred).
    public var registrationState: UInt32?
    /// `Modem.AccessTechnologies` bit flags.
    public var accessTechnologies: UInt32?

    public init(registrationState: UInt32? = nil, accessTechnologies: UInt32? = nil) {
        self.registrationState = registrationState
        self.accessTechnologies = accessTechnologies
    }

    /// GSM, GSM Compact, GPRS, EDGE, 1xRTT.
    public static let secondGeneration: UInt32 = 1 << 1 | 1 << 2 | 1 << 3 | 1 << 4 | 1 << 10

    var isRoaming: Bool { [5, 7, 10].contains(registrationState ?? 0) }

    var isOnly2G: Bool {
        guard let technologies = accessTechnologies, technologies != 0 else { return false }
        return technologies & ~Self.secondGeneration == 0
    }
}
