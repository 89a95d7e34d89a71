import BackhaulCore
import Glibc
import Logging
import Systemd
import Threads

/// Where the engine takes the network from (`--network-source`, docs/network.md).
public enum NetworkSourceMode: String, Sendable, CaseIterable {
    /// NetworkManager whenever its name is on the system bus, else the routing table.
    case auto
    /// NetworkManager only: while it is not on the bus the network reads as none.
    case networkManager = "networkmanager"
    /// The routing table only; the bus is never opened.
    case routingTable = "routing-table"
}

/// Follows NetworkManager (and ModemManager for a cellular connection) on the system bus, on a
/// thread of its own that owns the bus: it reads the primary connection's properties at start,
/// again whenever a `PropertiesChanged` under their paths or a `NameOwnerChanged` of their names
/// arrives, and publishes the view (nil while NetworkManager is not on the bus or the bus does
/// not answer). Calls are bounded (`callTimeout`), so a bus that stops answering delays only this
/// thread, never the engine or the API.
final class NetworkManagerWatcher: Sendable {
    static let manager = "org.freedesktop.NetworkManager"
    static let managerPath = "/org/freedesktop/NetworkManager"
    static let modemManager = "org.freedesktop.ModemManager1"

    private let thread = WorkerThread(name: "bh-netmanager")
    private let stopping = Locked(false)
    private let logger: Logger
    private let classifier: NetworkClassifier
    private let callTimeout: Double
    private let publish: @Sendable (NetworkState?) -> Void

    init(
        logger: Logger, classifier: NetworkClassifier, callTimeout: Double = 2,
        publish: @escaping @Sendable (NetworkState?) -> Void
    ) {
        self.logger = logger
        self.classifier = classifier
        self.callTimeout = callTimeout
        self.publish = publish
    }

    func start() { thread.start { [self] in run() } }

    func stop() {
        stopping.withLock { $0 = true }
        thread.join()
    }

    private var isStopping: Bool { stopping.withLock { $0 } }

    private func run() {
        var bus: SystemBus?
        var dirty = true
        var unreachableLogged = false
        var missing = MissingProperties(logger: logger)
        while !isStopping {
            guard let open = bus else {
                do {
                    let opened = try SystemBus(callTimeout: callTimeout)
                    for rule in Self.rules { try opened.watch(rule) }
                    bus = opened
                    dirty = true
                    unreachableLogged = false
                } catch {
                    if !unreachableLogged {
                        logger.notice(
                            "the system bus cannot be reached: the network is read from the routing table",
                            metadata: ["error": "\(error)"])
                        unreachableLogged = true
                    }
                    publish(nil)
                    for _ in 0..<10 where !isStopping { usleep(100_000) }
                }
                continue
            }
            do {
                if dirty {
                    dirty = false
                    publish(try read(open, &missing))
                }
                try open.wait(timeout: 0.25)
                if open.takeSignalled() { dirty = true }
            } catch {
                logger.warning(
                    "the system bus failed: the network is read from the routing table until it answers again",
                    metadata: ["error": "\(error)"])
                bus = nil
                publish(nil)
            }
        }
    }

    /// PropertiesChanged of every object under the two managers' paths, and their names coming
    /// and going.
    static let rules = [
        "type='signal',interface='org.freedesktop.DBus.Properties',member='PropertiesChanged',path_namespace='/org/freedesktop/NetworkManager'",
        "type='signal',interface='org.freedesktop.DBus.Properties',member='PropertiesChanged',path_namespace='/org/freedesktop/ModemManager1'",
        "type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='\(manager)'",
        "type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='\(modemManager)'",
    ]

    /// The view now; nil when NetworkManager is not on the bus or its manager object does not
    /// answer. An object that vanished or a property missing or of another type leaves its
    /// field unknown (logged once per property).
    private func read(_ bus: SystemBus, _ missing: inout MissingProperties) throws(BusError) -> NetworkState? {
        guard try bus.nameHasOwner(Self.manager) else { return nil }
        let manager: [String: BusValue]
        do {
            manager = try bus.properties(destination: Self.manager, path: Self.managerPath, interface: Self.manager)
        } catch {
            logger.warning("NetworkManager does not answer: the routing table is used", metadata: ["error": "\(error)"])
            return nil
        }
        let reading = Self.reading(
            manager: manager,
            connection: { objectProperties(bus, Self.manager, $0, "org.freedesktop.NetworkManager.Connection.Active") },
            device: { objectProperties(bus, Self.manager, $0, "org.freedesktop.NetworkManager.Device") },
            modem: {
                (
                    objectProperties(bus, Self.modemManager, $0, "org.freedesktop.ModemManager1.Modem"),
                    objectProperties(bus, Self.modemManager, $0, "org.freedesktop.ModemManager1.Modem.Modem3gpp")
                )
            }, missing: &missing)
        return reading.network(classifier: classifier)
    }

    /// The reading from the property maps: the manager's, then those of the objects it names,
    /// which `connection`, `device` and `modem` (the modem's and its 3GPP interface's) give by
    /// object path. No bus: the fuzz target `dbus` feeds it values of any type (docs/security.md).
    static func reading(
        manager: [String: BusValue], connection: (String) -> [String: BusValue], device: (String) -> [String: BusValue],
        modem: (String) -> ([String: BusValue], [String: BusValue]), missing: inout MissingProperties
    ) -> NetworkManagerReading {
        var reading = NetworkManagerReading()
        reading.connectivity = missing.value(manager, "Connectivity", of: "manager", \.uint32)
        reading.managerMetered = missing.value(manager, "Metered", of: "manager", \.uint32)
        reading.primaryConnection =
            missing.value(manager, "PrimaryConnection", of: "manager", \.string)
            ?? manager["ActiveConnections"]?.objectPaths?.first
        guard let primary = reading.primaryConnection, primary != "/" else { return reading }
        let active = connection(primary)
        reading.connectionType =
            missing.value(active, "Type", of: "active connection", \.string) ?? manager["PrimaryConnectionType"]?.string
        var modemPath: String?
        for (index, path) in (missing.value(active, "Devices", of: "active connection", \.objectPaths) ?? []).prefix(8)
            .enumerated()
        {
            let properties = device(path)
            if let type = missing.value(properties, "DeviceType", of: "device", \.uint32) { reading.deviceTypes.append(type) }
            if index == 0 {
                reading.interface = missing.value(properties, "Interface", of: "device", \.string)
                reading.deviceMetered = missing.value(properties, "Metered", of: "device", \.uint32)
            }
            if let udi = properties["Udi"]?.string, udi.hasPrefix("/org/freedesktop/ModemManager1/") {
                modemPath = modemPath ?? udi
            }
        }
        if reading.type == .cellular, let modemPath {
            let (modemProperties, threeGPP) = modem(modemPath)
            reading.modem = ModemReading(
                registrationState: missing.value(threeGPP, "RegistrationState", of: "modem", \.uint32),
                accessTechnologies: missing.value(modemProperties, "AccessTechnologies", of: "modem", \.uint32))
        }
        return reading
    }

    /// An object's properties; none (each field then unknown) when it vanished or fails.
    private func objectProperties(_ bus: SystemBus, _ destination: String, _ path: String, _ interface: String)
        -> [String: BusValue]
    {
        do {
            return try bus.properties(destination: destination, path: path, interface: interface)
        } catch {
            logger.info(
                "a bus object could not be read; its fields are unknown",
                metadata: ["dbus.path": "\(path)", "dbus.interface": "\(interface)", "error": "\(error)"])
            return [:]
        }
    }
}

/// Properties found missing or of another type, each logged once.
struct MissingProperties {
    let logger: Logger
    var logged: Set<String> = []

    mutating func value<T>(_ properties: [String: BusValue], _ name: String, of object: String, _ read: (BusValue) -> T?)
        -> T?
    {
        if let value = properties[name].flatMap(read) { return value }
        if !properties.isEmpty, logged.insert(object + "." + name).inserted {
            logger.notice(
                "a NetworkManager property is missing or of another type: that field falls back",
                metadata: [
                    "dbus.object": "\(object)", "dbus.property": "\(name)",
                    "dbus.value": "\(properties[name].map { "\($0)" } ?? "absent")",
                ])
        }
        return nil
    }
}
