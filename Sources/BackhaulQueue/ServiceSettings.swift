import BackhaulCore
import Glibc
import JSONCodec
import Threads

/// The settings an operator changes at run time (docs/policy.md): the network override a host
/// agent sets, and the service policy that replaces the config file's. They live in the store
/// (they survive restarts); this keeps them in memory for every reader. A change is applied from
/// the value its own transaction wrote, once that commit is settled, not read back: a read that
/// failed then would leave a committed change unapplied. It observes the store before anyone else,
/// so an API call that changed one sees it changed when it returns, and the engine hears of it
/// after.
public final class ServiceSettings: Sendable {
    static let policyKey = "policy"
    /// The network override's key: a network is each node's own, so a fleet's node keeps its own
    /// (`network_override@<node>`, docs/fleet.md); one daemon has the plain key.
    let networkOverrideKey: String

    private let store: any StateStore
    /// The config file's policy: what `DELETE /v1/policy` goes back to.
    public let basePolicy: ServicePolicy
    public let classifier: NetworkClassifier
    private let current: Locked<(policy: ServicePolicy, networkOverride: NetworkState?)>
    /// The values the writes in flight give each setting, set inside their transaction (so in
    /// commit order): a commit that changed a setting applies its value from here.
    private let staged = Locked<[String: Staged]>([:])
    /// A read of the stored values failed (the database was away): they are read again with the
    /// next change the store reports, whatever it is, until a read succeeds. Without this a
    /// change heard while the reader's connection was broken was never applied.
    private let reloadOwed = Locked(false)

    private enum Staged {
        case policy(ServicePolicy)
        case networkOverride(NetworkState?)
    }

    /// Loads what is stored; a stored value this build cannot read refuses the start
    /// (`StoreError.corrupt`): running without it could send over a network the operator ruled out.
    public init(
        store: any StateStore, basePolicy: ServicePolicy, classifier: NetworkClassifier, node: String? = nil
    ) throws(StoreError) {
        networkOverrideKey = node.map { "network_override@\($0)" } ?? "network_override"
        self.store = store
        self.basePolicy = basePolicy
        self.classifier = classifier
        current = Locked((basePolicy, nil))
        try reload()
        store.observe { [weak self] changes in
            guard let self else { return }
            let owed = reloadOwed.withLock { $0 }
            guard !changes.settings.isEmpty || changes.queueReload || owed else { return }
            self.apply(changes.settings, readAll: changes.queueReload || owed)
        }
    }

    public var policy: ServicePolicy { current.withLock { $0.policy } }
    public var networkOverride: NetworkState? { current.withLock { $0.networkOverride } }

    /// Replaces the run-time policy (nil: back to the config file's). Turning transfers off
    /// cancels every unfinished task with reason 1 (OpenAPI/backhaul.yaml). Returns the policy in force.
    @discardableResult
    public func setPolicy(_ policy: ServicePolicy?) throws(StoreError) -> ServicePolicy {
        let effective = policy ?? basePolicy
        try store.setSetting(Self.policyKey, policy?.json) { [staged] in
            staged.withLock { $0[Self.policyKey] = .policy(effective) }
        }
        if !effective.transfersEnabled { _ = try store.cancelUnfinished(reason: .backgroundUpdatesDisabled) }
        return effective
    }

    /// Sets (or with nil, removes) a host agent's network override.
    public func setNetworkOverride(_ state: NetworkState?) throws(StoreError) {
        try store.setSetting(networkOverrideKey, state?.overrideJSON) { [staged, networkOverrideKey] in
            staged.withLock { $0[networkOverrideKey] = .networkOverride(state) }
        }
    }

    /// Applies the values that a settled commit gave `keys` (on the store's writer or settler thread).
    /// A key with no value staged here was changed by another daemon on the same store (a fleet on
    /// PostgreSQL, docs/fleet.md): its value is read from the store, as every value is when
    /// `readAll` (changes may have been missed).
    private func apply(_ keys: Set<String>, readAll: Bool) {
        let (values, elsewhere) = staged.withLock { staged -> ([Staged], Bool) in
            let values = keys.compactMap { staged.removeValue(forKey: $0) }
            return (values, values.count < keys.count)
        }
        current.withLock { current in
            for value in values {
                switch value {
                case .policy(let policy): current.policy = policy
                case .networkOverride(let state): current.networkOverride = state
                }
            }
        }
        guard elsewhere || readAll else { return }
        // A read on a connection the outage broke fails once; the next opens a fresh one.
        for attempt in 0..<3 {
            do {
                try reload()
                reloadOwed.withLock { $0 = false }
                return
            } catch {
                if attempt < 2 { usleep(UInt32(20_000 << attempt)) }
            }
        }
        reloadOwed.withLock { $0 = true }
    }

    private func reload() throws(StoreError) {
        let override = try store.setting(networkOverrideKey)
        let stored = try store.setting(Self.policyKey)
        let state: (ServicePolicy, NetworkState?)
        do {
            state = (
                try stored.map { try basePolicy.applying($0) } ?? basePolicy,
                try override.map { try NetworkState.decodeOverride($0, classifier: classifier) }
            )
        } catch {
            throw StoreError.corrupt(
                "the stored network override or run-time policy cannot be read (\(error)); to drop both, "
                    + "run: sqlite3 STATE_DIR/backhaul.db \"DELETE FROM settings WHERE key IN ('network_override', 'policy')\"")
        }
        current.withLock { $0 = state }
    }
}
