import JSONValue

/// The kinds of network the policy tells apart (docs/policy.md).
public enum NetworkType: String, Sendable, CaseIterable {
    case wired, wifi, cellular, other, none
}

/// Whether the network reaches the internet, as NetworkManager checks it (docs/network.md).
public enum Connectivity: String, Sendable, CaseIterable {
    /// Checked and reachable.
    case full
    /// Connected, but the internet is not reachable.
    case limited
    /// A captive portal holds the link.
    case portal
    /// Not connected.
    case none
    /// Not checked (the routing table, or NetworkManager with its checks disabled): not offline.
    case unknown
}

/// The active network as the policy sees it: `GET /v1/network`.
public struct NetworkState: Sendable, Equatable {
    /// Where the view comes from, in the order sources win (docs/network.md).
    public enum Source: String, Sendable {
        case override
        case networkManager = "networkmanager"
        case routingTable = "routing_table"
    }

    public var type: NetworkType
    public var interface: String?
    public var expensive: Bool
    public var constrained: Bool
    /// A cellular network away from home (always expensive).
    public var roaming: Bool
    public var connectivity: Connectivity
    public var source: Source

    public init(
        type: NetworkType, interface: String? = nil, expensive: Bool = false, constrained: Bool = false,
        roaming: Bool = false, connectivity: Connectivity = .unknown, source: Source = .routingTable
    ) {
        self.type = type
        self.interface = interface
        self.expensive = expensive
        self.constrained = constrained
        self.roaming = roaming
        // No network is no connectivity, whatever a check said last.
        self.connectivity = type == .none ? Connectivity.none : connectivity
        self.source = source
    }

    public static let disconnected = NetworkState(type: .none)

    /// The API's view: what an override holds, and where it came from.
    public var json: JSON {
        guard case .object(var object) = overrideJSON else { return overrideJSON }
        object["source"] = .string(source.rawValue)
        return .object(object)
    }

    /// The form `decodeOverride` reads back (what the store keeps of an override).
    public var overrideJSON: JSON {
        [
            "type": .string(type.rawValue), "interface": interface.map { .string($0) } ?? .null, "expensive": .bool(expensive),
            "constrained": .bool(constrained), "roaming": .bool(roaming), "connectivity": .string(connectivity.rawValue),
        ]
    }

    /// A `PUT /v1/network` body: `type` required; `expensive` defaults to the classifier's rule for
    /// the type (cellular is expensive) or true when roaming, `constrained` and `roaming` to false,
    /// `connectivity` to `unknown` (not offline; the type `none` is always `none`).
    public static func decodeOverride(_ value: JSON, classifier: NetworkClassifier) throws(ValidationError) -> NetworkState {
        let reader = try FieldReader(value, path: "")
        try reader.rejectUnknown(["type", "interface", "expensive", "constrained", "roaming", "connectivity"])
        let name = try reader.requiredString("type", maxLength: 16)
        guard let type = NetworkType(rawValue: name) else {
            throw ValidationError(reader.field("type"), "must be one of wired, wifi, cellular, other, none")
        }
        let interface = try reader.string("interface", maxLength: 64)
        let roaming = try reader.bool("roaming") ?? false
        var connectivity = Connectivity.unknown
        if let text = try reader.string("connectivity", maxLength: 16) {
            guard let value = Connectivity(rawValue: text) else {
                throw ValidationError(reader.field("connectivity"), "must be one of full, limited, portal, none, unknown")
            }
            connectivity = value
        }
        return NetworkState(
            type: type, interface: interface,
            expensive: try reader.bool("expensive") ?? (roaming || classifier.expensiveTypes.contains(type)),
            constrained: try reader.bool("constrained") ?? false, roaming: roaming, connectivity: connectivity,
            source: .override)
    }
}

/// Classifies the default route's interface by name patterns (shell globs).
public struct NetworkClassifier: Sendable, Equatable {
    public var cellular = ["wwan*", "ppp*", "rmnet*", "usb*"]
    public var wifi = ["wl*"]
    public var wired = ["eth*", "en*", "em*"]
    /// Types that are expensive whatever the interface.
    public var expensiveTypes: Set<NetworkType> = [.cellular]
    /// Interfaces that are expensive (a tethered phone seen as wired, say).
    public var expensiveInterfaces: [String] = []
    /// Interfaces that are constrained (low-data mode).
    public var constrainedInterfaces: [String] = []

    public init() {}

    public func classify(interface: String?) -> NetworkState {
        guard let interface else { return .disconnected }
        func matches(_ patterns: [String]) -> Bool { patterns.contains { Glob.matches($0, interface) } }
        let type: NetworkType = matches(cellular) ? .cellular : matches(wifi) ? .wifi : matches(wired) ? .wired : .other
        return NetworkState(
            type: type, interface: interface,
            expensive: expensiveTypes.contains(type) || matches(expensiveInterfaces),
            constrained: matches(constrainedInterfaces))
    }

    /// The interface of the default route in a `/proc/net/route` table: destination 0.0.0.0,
    /// flag RTF_UP, the lowest metric; nil when there is none.
    public static func defaultInterface(routeTable: String) -> String? {
        var best: (metric: Int, interface: String)?
        for line in routeTable.split(separator: "\n").dropFirst() {
            let fields = line.split(whereSeparator: { $0 == "\t" || $0 == " " })
            guard fields.count >= 7, fields[1] == "00000000", let flags = Int(fields[3], radix: 16), flags & 0x1 != 0,
                let metric = Int(fields[6])
            else { continue }
            if best == nil || metric < best!.metric { best = (metric, String(fields[0])) }
        }
        return best?.interface
    }

    /// The `network` object of the config file (each member optional, lists of patterns).
    public mutating func apply(_ value: JSON) throws(ValidationError) {
        let reader = try FieldReader(value, path: "network")
        try reader.rejectUnknown([
            "cellular_interfaces", "wifi_interfaces", "wired_interfaces", "expensive_types",
            "expensive_interfaces", "constrained_interfaces", "route_file", "check_interval",
        ])
        if let list = try reader.stringList("cellular_interfaces") { cellular = list }
        if let list = try reader.stringList("wifi_interfaces") { wifi = list }
        if let list = try reader.stringList("wired_interfaces") { wired = list }
        if let list = try reader.stringList("expensive_interfaces") { expensiveInterfaces = list }
        if let list = try reader.stringList("constrained_interfaces") { constrainedInterfaces = list }
        if let list = try reader.stringList("expensive_types") {
            var types: Set<NetworkType> = []
            for name in list {
                guard let type = NetworkType(rawValue: name) else {
                    throw ValidationError(reader.field("expensive_types"), "\(name) is not a network type")
                }
                types.insert(type)
            }
            expensiveTypes = types
        }
    }
}

/// Shell-style patterns: `*` any run, `?` one character.
///
/// Matched in O(pattern × text) steps at worst, never exponentially: patterns and texts are
/// client-controlled (token scopes against session ids, allow-lists against hosts). A `*` only
/// remembers where it was last seen; a mismatch after it retries from there one character
/// further, and an earlier `*` is never revisited (a later one can absorb whatever it would have).
public enum Glob {
    public static func matches(_ pattern: String, _ text: String) -> Bool {
        var steps = 0
        return matches(Array(pattern.unicodeScalars), Array(text.unicodeScalars), steps: &steps)
    }

    /// The matcher, counting its steps (tests bound them).
    static func matches(_ pattern: [Unicode.Scalar], _ text: [Unicode.Scalar], steps: inout Int) -> Bool {
        var p = 0
        var t = 0
        var star: (pattern: Int, text: Int)?
        while t < text.count {
            steps += 1
            if p < pattern.count, pattern[p] == "*" {
                star = (p, t)
                p += 1
            } else if p < pattern.count, pattern[p] == "?" || pattern[p] == text[t] {
                p += 1
                t += 1
            } else if let last = star {
                // Let the last `*` take one more character and try the rest again.
                star = (last.pattern, last.text + 1)
                p = last.pattern + 1
                t = last.text + 1
            } else {
                return false
            }
        }
        while p < pattern.count, pattern[p] == "*" { p += 1 }
        return p == pattern.count
    }
}
