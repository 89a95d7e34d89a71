import BackhaulCore
import BackhaulEngine
import BackhaulStore
import JSON
import MicroHTTP

/// `/v1/network` and `/v1/policy` (SPEC §2.5): what the policy layer sees, and how a host agent
/// or an operator changes it.
extension API {
    func policyEngine() throws(Problem) -> Engine {
        guard let engine else { throw Problem(.unavailable, "the transfer engine is not running") }
        return engine
    }

    /// The network in force; the routing table is read again first (detection on demand).
    @Sendable func getNetwork(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        API.json(200, try policyEngine().refreshNetwork().json)
    }

    /// A host agent that knows better (a modem manager, a fleet agent) sets the network.
    @Sendable func putNetwork(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let engine = try policyEngine()
        let value = try body(request)
        let state = try validated { try NetworkState.decodeOverride(value, classifier: engine.classifier) }
        return API.json(200, try stored { () throws(StoreError) in try engine.setNetworkOverride(state) }.json)
    }

    /// Back to detection.
    @Sendable func deleteNetwork(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let engine = try policyEngine()
        return API.json(200, try stored { () throws(StoreError) in try engine.setNetworkOverride(nil) }.json)
    }

    /// The policy in force, with what is left today of each discretionary budget (the engine's
    /// figures, at most a loop turn old), so any token can see how much may still go.
    @Sendable func getPolicy(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let engine = try policyEngine()
        let policy = engine.policy
        guard case .object(var object) = policy.json else { return API.json(200, policy.json) }
        var remaining = JSONObject()
        let figures = engine.metrics.budgetRemaining
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
        let engine = try policyEngine()
        let value = try body(request)
        let policy = try validated { try engine.policy.applying(value, path: "") }
        return API.json(200, try stored { () throws(StoreError) in try engine.setPolicy(policy) }.json)
    }

    /// Back to the config file's policy.
    @Sendable func deletePolicy(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        let engine = try policyEngine()
        return API.json(200, try stored { () throws(StoreError) in try engine.setPolicy(nil) }.json)
    }
}
