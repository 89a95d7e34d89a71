import JSONValue

/// A daily window in the daemon's local time, `from` included, `to` excluded; it may wrap past
/// midnight (`22:00`–`06:00`).
public struct DayWindow: Sendable, Equatable {
    /// Minutes after midnight.
    public var from: Int
    public var to: Int

    public init(from: Int, to: Int) {
        self.from = from
        self.to = to
    }

    public func contains(minute: Int) -> Bool {
        from <= to ? (from <= minute && minute < to) : (minute >= from || minute < to)
    }

    public var json: JSON { ["from": .string(Self.format(from)), "to": .string(Self.format(to))] }

    static func decode(_ reader: FieldReader) throws(ValidationError) -> DayWindow {
        try reader.rejectUnknown(["from", "to", "limit"])
        func minute(_ key: String) throws(ValidationError) -> Int {
            let text = try reader.requiredString(key, maxLength: 5)
            let parts = text.split(separator: ":")
            guard parts.count == 2, parts[0].count == 2, parts[1].count == 2, let hours = Int(parts[0]),
                let minutes = Int(parts[1]),
                (0...23).contains(hours), (0...59).contains(minutes)
            else { throw ValidationError(reader.field(key), "must be a time of day HH:MM") }
            return hours * 60 + minutes
        }
        let window = DayWindow(from: try minute("from"), to: try minute("to"))
        guard window.from != window.to else { throw ValidationError(reader.field("to"), "must differ from from") }
        return window
    }

    static func format(_ minute: Int) -> String {
        let hours = minute / 60
        let minutes = minute % 60
        return (hours < 10 ? "0" : "") + "\(hours):" + (minutes < 10 ? "0" : "") + "\(minutes)"
    }
}

/// The service-wide policy (docs/policy.md): from the config file's `policy` object, replaceable at
/// run time with `PUT /v1/policy`.
public struct ServicePolicy: Sendable, Equatable {
    /// false: every unfinished task is cancelled with reason 1 and new tasks are refused.
    public var transfersEnabled = true
    /// Bytes/s shared by all running transfers; nil: no limit.
    public var bandwidthLimit: Int64?
    /// A tighter limit while the active network is of a type.
    public var bandwidthLimitByNetwork: [NetworkType: Int64] = [:]
    /// Limits for times of day.
    public var bandwidthSchedule: [(window: DayWindow, limit: Int64)] = []
    /// Discretionary tasks run only inside this window (nil: any time).
    public var discretionaryWindow: DayWindow?
    /// Bytes discretionary tasks may send per local day on each network type (absent: no budget).
    public var discretionaryDailyBudget: [NetworkType: Int64] = [:]

    /// The service type of a discretionary task that sets none itself (`default` unless set).
    public var discretionaryNetworkServiceType = NetworkServiceType.default

    public init() {}

    /// How a transfer shares the link: its configuration's `network_service_type` when set; else
    /// the policy's default for discretionary tasks when it is discretionary; else `default`.
    public func networkServiceType(for configuration: TransferConfiguration) -> NetworkServiceType {
        configuration.networkServiceType ?? (configuration.discretionary ? discretionaryNetworkServiceType : .default)
    }

    public static func == (lhs: ServicePolicy, rhs: ServicePolicy) -> Bool { lhs.json == rhs.json }

    /// The bandwidth limit in force: the smallest of those that apply.
    public func bandwidth(minuteOfDay: Int, network: NetworkType) -> Int64? {
        var limits = [bandwidthLimit, bandwidthLimitByNetwork[network]].compactMap { $0 }
        limits += bandwidthSchedule.filter { $0.window.contains(minute: minuteOfDay) }.map(\.limit)
        return limits.min()
    }

    /// Minutes from `minuteOfDay` to the next moment a window opens or closes or the day (and
    /// with it the budgets) turns: when decisions must be made again.
    public func minutesToNextEdge(minuteOfDay: Int) -> Int {
        var edges = [24 * 60]
        let windows = bandwidthSchedule.map(\.window) + (discretionaryWindow.map { [$0] } ?? [])
        for window in windows { edges += [window.from, window.to, window.from + 24 * 60, window.to + 24 * 60] }
        return edges.map { $0 - minuteOfDay }.filter { $0 > 0 }.min() ?? 24 * 60
    }

    public var json: JSON {
        func byType(_ map: [NetworkType: Int64]) -> JSON {
            var object = JSONObject()
            for type in NetworkType.allCases { if let value = map[type] { object[type.rawValue] = .int(value) } }
            return .object(object)
        }
        var object = JSONObject()
        object["transfers_enabled"] = .bool(transfersEnabled)
        object["bandwidth_limit"] = bandwidthLimit.map { .int($0) } ?? .null
        object["bandwidth_limit_by_network"] = byType(bandwidthLimitByNetwork)
        object["bandwidth_schedule"] = .array(
            bandwidthSchedule.map { entry in
                guard case .object(var window) = entry.window.json else { return .null }
                window["limit"] = .int(entry.limit)
                return .object(window)
            })
        object["discretionary_window"] = discretionaryWindow?.json ?? .null
        object["discretionary_daily_budget"] = byType(discretionaryDailyBudget)
        object["discretionary_network_service_type"] = .string(discretionaryNetworkServiceType.rawValue)
        return .object(object)
    }

    /// Reads a policy object; absent members keep this policy's values.
    public func applying(_ value: JSON, path: String = "policy") throws(ValidationError) -> ServicePolicy {
        let reader = try FieldReader(value, path: path)
        try reader.rejectUnknown([
            "transfers_enabled", "bandwidth_limit", "bandwidth_limit_by_network", "bandwidth_schedule",
            "discretionary_window", "discretionary_daily_budget", "discretionary_network_service_type",
        ])
        var result = self
        func byType(_ key: String) throws(ValidationError) -> [NetworkType: Int64]? {
            guard let map = try reader.object(key) else { return nil }
            var result: [NetworkType: Int64] = [:]
            for (name, _) in map.object {
                guard let type = NetworkType(rawValue: name) else {
                    throw ValidationError(map.field(name), "is not a network type")
                }
                result[type] = try map.integer(name, in: 0...(1 << 50))
            }
            return result
        }
        if let value = try reader.bool("transfers_enabled") { result.transfersEnabled = value }
        if reader.has("bandwidth_limit") { result.bandwidthLimit = try reader.integer("bandwidth_limit", in: 1024...(1 << 40)) }
        if let map = try byType("bandwidth_limit_by_network") {
            guard map.values.allSatisfy({ $0 >= 1024 }) else {
                throw ValidationError(reader.field("bandwidth_limit_by_network"), "limits must be at least 1024 bytes/s")
            }
            result.bandwidthLimitByNetwork = map
        }
        if let items = reader.value("bandwidth_schedule"), !items.isNull {
            guard let list = items.arrayValue, list.count <= 48 else {
                throw ValidationError(reader.field("bandwidth_schedule"), "must be an array of at most 48 windows")
            }
            result.bandwidthSchedule = []
            for (index, item) in list.enumerated() {
                let entry = try FieldReader(item, path: reader.field("bandwidth_schedule") + "[\(index)]")
                guard let limit = try entry.integer("limit", in: 1024...(1 << 40)) else {
                    throw ValidationError(entry.field("limit"), "is required (bytes/s)")
                }
                result.bandwidthSchedule.append((try DayWindow.decode(entry), limit))
            }
        }
        if reader.has("discretionary_window") {
            result.discretionaryWindow = try reader.object("discretionary_window").map { reader throws(ValidationError) in
                try DayWindow.decode(reader)
            }
        }
        if let map = try byType("discretionary_daily_budget") { result.discretionaryDailyBudget = map }
        if let value = try reader.serviceType("discretionary_network_service_type") {
            result.discretionaryNetworkServiceType = value
        }
        return result
    }
}

/// Everything outside a task that decides whether it may run now.
public struct PolicyContext: Sendable, Equatable {
    public var network: NetworkState
    public var policy: ServicePolicy
    public var now: Timestamp
    /// Local minutes after midnight.
    public var minuteOfDay: Int
    /// Bytes discretionary tasks sent today, by network type.
    public var budgetUsed: [NetworkType: Int64]

    public init(
        network: NetworkState, policy: ServicePolicy = ServicePolicy(), now: Timestamp = 0, minuteOfDay: Int = 0,
        budgetUsed: [NetworkType: Int64] = [:]
    ) {
        self.network = network
        self.policy = policy
        self.now = now
        self.minuteOfDay = minuteOfDay
        self.budgetUsed = budgetUsed
    }
}

public enum PolicyDecision: Sendable, Equatable {
    case run
    case wait(WaitingReason)
    case fail(TaskError)
}

/// The policy as one pure function (OpenAPI/backhaul.yaml, §2.5): the engine asks it before a task starts,
/// and again for every queued, waiting and running task whenever an input changes.
public enum Policy {
    /// Waiting reasons this function gives (and takes back when conditions change), and the
    /// engine's `aws_credentials…`, taken back at the same reviews once the keys are there.
    public static let reasons = Set<WaitingReason>([
        .noConnectivity, .limitedConnectivity, .roamingNotAllowed, .cellularNotAllowed, .expensiveNetworkNotAllowed,
        .constrainedNetworkNotAllowed,
        .discretionaryDeferred, .budgetExhausted,
    ]).union(WaitingReason.awsCredentialReasons)

    public static func decide(
        _ configuration: TransferConfiguration, earliestBeginAt: Timestamp? = nil, hostSlotFree: Bool = true,
        in context: PolicyContext
    ) -> PolicyDecision {
        if let begin = earliestBeginAt, begin > context.now { return .wait(.scheduled) }
        let network = context.network
        /// A forbidden network: wait for a better one, or fail when the task may not wait.
        func forbidden(_ reason: WaitingReason, _ kind: TaskError.Kind, _ message: String) -> PolicyDecision {
            configuration.waitsForConnectivity ? .wait(reason) : .fail(TaskError(kind, message: message))
        }
        if network.type == .none || network.connectivity == .none {
            return forbidden(
                .noConnectivity, .notConnectedToInternet, "no network is connected and waits_for_connectivity is false")
        }
        if network.connectivity == .limited || network.connectivity == .portal {
            return forbidden(
                .limitedConnectivity, .notConnectedToInternet,
                "the network's connectivity is \(network.connectivity.rawValue) and waits_for_connectivity is false")
        }
        if network.roaming, !configuration.allowsRoaming {
            return forbidden(.roamingNotAllowed, .dataNotAllowed, "the network is roaming and allows_roaming is false")
        }
        if network.type == .cellular, !configuration.allowsCellularAccess {
            return forbidden(.cellularNotAllowed, .dataNotAllowed, "the network is cellular and allows_cellular_access is false")
        }
        if network.expensive, !configuration.allowsExpensiveNetworkAccess {
            return forbidden(
                .expensiveNetworkNotAllowed, .dataNotAllowed,
                "the network is expensive and allows_expensive_network_access is false")
        }
        if network.constrained, !configuration.allowsConstrainedNetworkAccess {
            return forbidden(
                .constrainedNetworkNotAllowed, .dataNotAllowed,
                "the network is constrained and allows_constrained_network_access is false")
        }
        if configuration.discretionary {
            if network.expensive || network.constrained { return .wait(.discretionaryDeferred) }
            if let window = context.policy.discretionaryWindow, !window.contains(minute: context.minuteOfDay) {
                return .wait(.discretionaryDeferred)
            }
            if let budget = context.policy.discretionaryDailyBudget[network.type],
                context.budgetUsed[network.type, default: 0] >= budget
            {
                return .wait(.budgetExhausted)
            }
        }
        return hostSlotFree ? .run : .wait(.hostConnectionLimit)
    }
}
