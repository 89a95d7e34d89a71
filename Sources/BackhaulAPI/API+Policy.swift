import BackhaulCore
import BackhaulQueue
import Glibc
import JSONCodec
import MicroHTTP

/// `/v1/network` and `/v1/policy` (docs/policy.md): what the policy layer sees, and how a host agent
/// or an operator changes it.
extension API {
    func serviceSettings() throws(Problem) -> ServiceSettings {
        guard let settings else { throw Problem(.unavailable, "the service settings are not available") }
        return settings
    }

    /// The network in force: the override a host agent set, else what is detected (the routing
    /// table is read again first: detection on demand).
    func networkInForce(refresh: Bool) throws(Problem) -> NetworkState {
        let settings = try serviceSettings()
        if let override = settings.networkOverride { return override }
        guard let status else { throw Problem(.unavailable, "the transfer engine is not running") }
        return status.detectedNetwork(refresh: refresh)
    }

    @Sendable func getNetwork(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        API.json(200, try networkInForce(refresh: true).json)
    }

    /// A host agent that knows better (a modem manager, a fleet agent) sets the network.
    @Sendable func putNetwork(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let settings = try serviceSettings()
        let value = try body(request)
        let state = try validated { try NetworkState.decodeOverride(value, classifier: settings.classifier) }
        try stored { () throws(StoreError) in try settings.setNetworkOverride(state) }
        return API.json(200, try networkInForce(refresh: false).json)
    }

    /// Back to detection.
    @Sendable func deleteNetwork(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let settings = try serviceSettings()
        try stored { () throws(StoreError) in try settings.setNetworkOverride(nil) }
        return API.json(200, try networkInForce(refresh: true).json)
    }

    /// The policy in force, with what is left today of each discretionary budget (the engine's
    /// figures, at most a loop turn old), so any token can see how much may still go.
    @Sendable func getPolicy(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let policy = try serviceSettings().policy
        guard case .object(var object) = policy.json else { return API.json(200, policy.json) }
        var remaining = JSONObject()
        let figures = status?.metrics.budgetRemaining ?? [:]
        for type in NetworkType.allCases {
            // A budget the engine has not counted yet (just set) is whole.
            guard let budget = policy.discretionaryDailyBudget[type] else { continue }
            remaining[type.rawValue] = .int(min(budget, figures[type] ?? budget))
        }
        object["budget_remaining"] = .object(remaining)
        return API.json(200, .object(object))
    }

    /// Members given replace the policy's; members left out keep their values.
    @Sendable func putPolicy(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let settings = try serviceSettings()
        let value = try body(request)
        let policy = try validated { try settings.policy.applying(value, path: "") }
        return API.json(200, try stored { () throws(StoreError) in try settings.setPolicy(policy) }.json)
    }

    /// Back to the config file's policy.
    @Sendable func deletePolicy(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let settings = try serviceSettings()
        return API.json(200, try stored { () throws(StoreError) in try settings.setPolicy(nil) }.json)
    }
}

extension API {
    /// `POST /v1/admin/backup {"path": "/abs/file.db"}`: a consistent copy of the state, written
    /// by the daemon to a new file on its own file system while transfers go on.
    @Sendable func backup(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let value = try body(request)
        guard let path = value["path"]?.stringValue, path.hasPrefix("/") else {
            throw Problem(.validationFailed, "path must be an absolute file path", extra: ["field": "path"])
        }
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        guard access(directory.isEmpty ? "/" : directory, W_OK) == 0 else {
            throw Problem(
                .fileNotWritable, "backhauld cannot write in \(directory.isEmpty ? "/" : directory)", extra: ["field": "path"])
        }
        let result = try stored { () throws(StoreError) in try store.backup(to: path) }
        return API.json(
            201,
            [
                "path": .string(result.path), "bytes": .int(result.bytes),
                "seconds": .double((result.seconds * 1000).rounded() / 1000),
            ])
    }
}
