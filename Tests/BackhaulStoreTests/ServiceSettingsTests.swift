import BackhaulCore
import JSONCodec
import Testing

@testable import BackhaulStore

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
}
