internal import CCurl
import Glibc
import Threads

/// A part of the process whose transfers run on the shared `CurlLoop` (the transfer engine,
/// the webhook dispatcher). Every method is called on the loop's thread.
public protocol CurlLoopClient: AnyObject {
    /// One turn of the loop, before curl runs: start transfers, fire timers. `transfers` adds and
    /// removes this client's handles.
    func turn(_ transfers: CurlTransfers)
    /// A transfer of this client ended (curl's result; its handle is already out of the multi).
    func finished(_ easy: EasyHandle, _ code: CurlCode, _ transfers: CurlTransfers)
    /// After curl ran: progress, bookkeeping.
    func afterPerform(_ transfers: CurlTransfers)
    /// How long the loop may sleep before this client's next turn (seconds; nil: until woken).
    var sleepLimit: Double? { get }
    /// True once the client has stopped for good; the loop ends when all have and it was asked to.
    var isDone: Bool { get }
}

/// The loop's multi handle as its clients see it, on the loop's thread only.
public final class CurlTransfers {
    let multi: MultiHandle
    fileprivate var owners: [UnsafeMutableRawPointer: any CurlLoopClient] = [:]

    init(multi: MultiHandle) { self.multi = multi }

    /// Starts a transfer for `client` (`curl_multi_add_handle`).
    public func add(_ easy: EasyHandle, for client: any CurlLoopClient) throws(CurlMultiCode) {
        try multi.add(easy)
        owners[easy.raw] = client
    }

    /// Stops a transfer (`curl_multi_remove_handle`); nothing is reported for it afterwards.
    public func remove(_ easy: EasyHandle) {
        multi.remove(easy)
        owners[easy.raw] = nil
    }
}

/// One thread that drives every transfer of the process: one curl multi handle (so connections
/// are pooled and reused across the engine's uploads and the webhooks), `curl_multi_poll`,
/// woken from other threads by `curl_multi_wakeup`. Its clients take turns on that thread.
public final class CurlLoop: Sendable {
    private nonisolated(unsafe) let transfers: CurlTransfers  // used on the loop thread only
    private let waker: MultiWaker
    private let thread = WorkerThread(name: "bh-curl")
    private let state = Locked<(clients: [Client], stopping: Bool)>(([], false))
    /// Errors of `curl_multi_perform`/`poll`, for the owner to log (rare: out of memory).
    private let onError: @Sendable (String) -> Void

    private struct Client: @unchecked Sendable {
        // @unchecked: clients are touched on the loop's thread only; the list is locked.
        let client: any CurlLoopClient
    }

    /// `keptConnections`: the size of the connection cache (`MultiHandle`). 0: libcurl's default,
    /// which scales with the transfers running at the moment, so it closes connections whenever
    /// transfers end faster than new ones start, and each costs a new handshake.
    public init(keptConnections: Int = 0, onError: @escaping @Sendable (String) -> Void = { _ in }) throws(CurlMultiCode) {
        let multi = try MultiHandle(keptConnections: keptConnections)
        transfers = CurlTransfers(multi: multi)
        waker = multi.waker
        self.onError = onError
    }

    /// Adds a client; call before `start`.
    public func register(_ client: any CurlLoopClient) {
        state.withLock { $0.clients.append(Client(client: client)) }
    }

    /// Wakes the loop from any thread: its clients take a turn now.
    public func wake() { waker.wake() }

    public var wakeHandle: MultiWaker { waker }

    public func start() {
        let transfers = UncheckedDriver(transfers)
        thread.start { [self] in run(transfers.value) }
    }

    /// Ends the loop once every client is done, and joins the thread.
    public func stop() {
        state.withLock { $0.stopping = true }
        waker.wake()
        thread.join()
    }

    private func run(_ transfers: CurlTransfers) {
        while true {
            let (clients, stopping) = state.withLock { ($0.clients.map(\.client), $0.stopping) }
            if stopping, clients.allSatisfy(\.isDone) { break }
            for client in clients where !client.isDone { client.turn(transfers) }
            do { try transfers.multi.perform() } catch { onError("curl_multi_perform: \(error)") }
            for (easy, code) in transfers.multi.completed() {
                guard let owner = transfers.owners.removeValue(forKey: easy.raw) else { continue }
                owner.finished(easy, code, transfers)
            }
            for client in clients where !client.isDone { client.afterPerform(transfers) }
            var sleep = 1.0
            for client in clients where !client.isDone { if let limit = client.sleepLimit { sleep = min(sleep, limit) } }
            if stopping { sleep = min(sleep, 0.1) }
            guard sleep > 0 else { continue }
            do { try transfers.multi.poll(timeoutMilliseconds: Int((sleep * 1000).rounded(.up))) } catch {
                onError("curl_multi_poll: \(error)")
            }
        }
    }
}

/// Hands the transfers to the loop's thread, which is then its only user.
private struct UncheckedDriver: @unchecked Sendable {
    let value: CurlTransfers
    init(_ value: CurlTransfers) { self.value = value }
}
