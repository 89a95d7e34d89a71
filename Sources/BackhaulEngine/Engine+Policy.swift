import BackhaulCore
import BackhaulFiles
import BackhaulStore
import JSON

/// The network and the service policy as the API sees and changes them (SPEC §2.5).
extension Engine {
    static let networkOverrideKey = "network_override"
    static let policyKey = "policy"

    /// The network in force: the override if a host agent set one, else what was detected.
    public var network: NetworkState { shared.withLock { $0.networkOverride ?? $0.detected } }

    public var policy: ServicePolicy { shared.withLock { $0.policy } }

    public var classifier: NetworkClassifier { options.classifier }

    /// Reads the routing table now (the engine also does every `networkCheckInterval`); a change
    /// wakes the engine to decide again. Returns the network in force.
    @discardableResult
    public func refreshNetwork() -> NetworkState {
        let detected = Self.detect(options)
        let changed = shared.withLock { state in
            defer { state.detected = detected }
            return state.detected != detected && state.networkOverride == nil
        }
        if changed { wake(policy: true) }
        return network
    }

    /// Sets (or with nil, removes) a host agent's override; it survives restarts.
    public func setNetworkOverride(_ state: NetworkState?) throws(StoreError) -> NetworkState {
        try store.setSetting(Self.networkOverrideKey, state?.overrideJSON)
        shared.withLock { $0.networkOverride = state }
        if state == nil { refreshNetwork() }
        wake(policy: true)
        return network
    }

    /// Replaces the run-time policy (nil: back to the config file's); it survives restarts.
    /// Turning transfers off cancels every unfinished task with reason 1.
    public func setPolicy(_ policy: ServicePolicy?) throws(StoreError) -> ServicePolicy {
        try store.setSetting(Self.policyKey, policy?.json)
        let effective = policy ?? options.policy
        shared.withLock { $0.policy = effective }
        if !effective.transfersEnabled { try cancelAllForDisabledTransfers() }
        wake(policy: true)
        return effective
    }

    func cancelAllForDisabledTransfers() throws(StoreError) {
        let count = try store.cancelUnfinished(reason: .backgroundUpdatesDisabled)
        if count > 0 { logger.notice("transfers are disabled: unfinished tasks cancelled", metadata: ["tasks.count": "\(count)"]) }
    }

    /// The default route's interface, classified; a table that cannot be read counts as `other`
    /// (detection failing must not stop uploads).
    static func detect(_ options: EngineOptions) -> NetworkState {
        guard let bytes = SmallFile.read(options.routeFile) else { return NetworkState(type: .other, interface: nil) }
        let interface = NetworkClassifier.defaultInterface(routeTable: String(decoding: bytes, as: UTF8.self))
        return options.classifier.classify(interface: interface)
    }
}
