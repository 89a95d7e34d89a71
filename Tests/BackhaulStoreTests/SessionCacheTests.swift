import BackhaulCore
import Testing

@testable import BackhaulQueue

@Suite("Session cache")
struct SessionCacheTests {
    /// The record a POST of a task validates against comes from the cache once read: every
    /// change that a write committed must show in the next read, as it did when each read was a
    /// query.
    @Test("a session read after a write shows that write: configuration, enabled, finishing, gone", arguments: Backend.allCases)
    func readsFollowWrites(_ backend: Backend) throws {
        let store = try backend.open()
        defer { store.close() }
        #expect(try store.sessionRecord(id: "s") == nil)
        _ = try store.putSession(id: "s", configuration: TransferConfiguration())
        #expect(try store.sessionRecord(id: "s")?.configuration.maxConnectionsPerHost == 6)
        var configuration = TransferConfiguration()
        configuration.maxConnectionsPerHost = 2
        _ = try store.updateSession(id: "s", cancelPending: false) { [configuration] _ in (configuration, nil) }
        #expect(try store.sessionRecord(id: "s")?.configuration.maxConnectionsPerHost == 2)
        _ = try store.updateSession(id: "s", cancelPending: false) { _ in (nil, false) }
        #expect(try store.sessionRecord(id: "s")?.enabled == false)
        _ = try store.deleteSession(id: "s", cancel: false)
        #expect(try store.sessionRecord(id: "s") == nil)
    }

    /// A read that began before a commit changed the session must not put what it read in the
    /// cache after the commit forgot it: that stale record would stay there.
    @Test("a record read from before a commit that changed sessions is not kept")
    func staleReadNotKept() {
        var cache = SessionCache()
        let old = SessionRecord(id: "s", configuration: TransferConfiguration(), enabled: true, lifecycle: .active, createdAt: 0)
        let readAt = cache.generation
        var changes = StoreChanges()
        changes.sessions = ["s"]
        cache.forget(changes)
        cache.keep(old, readAt: readAt)
        #expect(cache.records["s"] == nil)
        cache.keep(old, readAt: cache.generation)
        #expect(cache.records["s"] == old)
    }
}
