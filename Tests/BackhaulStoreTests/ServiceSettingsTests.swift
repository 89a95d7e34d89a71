import BackhaulCore
import BackhaulTesting
import JSONCodec
import Testing

@testable import BackhaulQueue

/// A committed change of a run-time setting is in force when the call that made it returns, taken
/// from the value its transaction wrote: a read of the settings that fails (here, a stored network
/// override this build cannot read) does not leave it unapplied.
@Suite("Service settings")
struct ServiceSettingsTests {
    @Test("a committed policy applies even when the settings cannot be read back", arguments: Backend.allCases)
    func policyAppliesWithoutReadingBack(_ backend: Backend) throws {
        let store = try backend.open()
        defer { store.close() }
        let settings = try ServiceSettings(store: store, basePolicy: ServicePolicy(), classifier: NetworkClassifier())
        // A stored override that does not decode, as a build with another format would leave.
        try store.setSetting(settings.networkOverrideKey, ["type": .int(42)])
        var limited = ServicePolicy()
        limited.bandwidthLimit = 1000
        #expect(try settings.setPolicy(limited) == limited)
        #expect(settings.policy.bandwidthLimit == 1000, "the committed policy is not in force")
        try settings.setPolicy(nil)
        #expect(settings.policy.bandwidthLimit == nil)
        try settings.setNetworkOverride(nil)
        #expect(settings.networkOverride == nil)
    }

    /// Another node's change is read from the store; a read that failed then (the database away)
    /// left it unapplied for good. It is read again with the next change of any kind.
    @Test("a policy set elsewhere while the settings cannot be read applies with the next change", arguments: Backend.allCases)
    func policyFromElsewhereAppliesOnceReadable(_ backend: Backend) throws {
        let store = try backend.open()
        defer { store.close() }
        let settings = try ServiceSettings(store: store, basePolicy: ServicePolicy(), classifier: NetworkClassifier())
        // Written behind the settings' back (as another node would), the first undecodable: every
        // read of the stored values fails while it is there.
        try store.setSetting(settings.networkOverrideKey, ["type": .int(42)])
        try store.setSetting(ServiceSettings.policyKey, ["bandwidth_limit": .int(4096)])
        #expect(settings.policy.bandwidthLimit == nil)
        // Readable again, with no settings change reported; the next change of anything applies it.
        try store.plant("DELETE FROM settings WHERE key = '\(settings.networkOverrideKey)'")
        _ = try store.putSession(id: "s", configuration: TransferConfiguration())
        #expect(
            eventually(timeout: 5) { settings.policy.bandwidthLimit == 4096 }, "the policy set elsewhere never came into force")
    }
}
