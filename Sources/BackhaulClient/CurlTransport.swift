import Curl
import Threads

/// libcurl through the `Curl` module's blocking `HTTPClient`, kept off the caller's task: calls
/// run one after another on a thread of the transport's own (one reused handle, so the
/// connection to the daemon is kept), and each stream on a thread of its own, so a stream never
/// holds up calls. Neither blocks Swift's cooperative pool: the caller awaits a continuation.
public final class CurlTransport: APITransport {
    private let calls = CallQueue()

    public init() {}

    deinit { calls.close() }

    public func send(_ request: APIRequest) async throws(TransportReason) -> APIResponse {
        let result: Result<APIResponse, TransportReason> = await withCheckedContinuation { continuation in
            calls.submit { client in continuation.resume(returning: Self.perform(request, client: &client)) }
        }
        return try result.get()
    }

    /// Runs on the call thread: the handle is made at the first call and kept.
    private static func perform(_ request: APIRequest, client: inout HTTPClient?) -> Result<APIResponse, TransportReason> {
        do {
            let http = try client ?? HTTPClient()
            client = http
            let exchange = try http.send(request.method, request.url, headers: request.headers, body: request.body)
            return .success(APIResponse(status: exchange.status, body: exchange.body))
        } catch {
            return .failure(TransportReason("\(error)"))
        }
    }

    public func stream(_ request: APIRequest, receive: @escaping @Sendable ([UInt8]) -> Void) async throws(TransportReason)
        -> APIResponse
    {
        // Set by the task's cancellation; curl's progress callback (at least once a second while
        // nothing arrives) and each piece of data read it and end the exchange.
        let stopped = Locked(false)
        let result: Result<APIResponse, TransportReason> = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let thread = WorkerThread(name: "bh-client-sse")
                thread.start {
                    let keepGoing = { !stopped.withLock { $0 } }
                    do {
                        let exchange = try HTTPClient().stream(
                            request.url, headers: request.headers,
                            receive: { bytes in
                                receive(Array(bytes))
                                return keepGoing()
                            }, tick: keepGoing)
                        continuation.resume(returning: .success(APIResponse(status: exchange.status, body: exchange.body)))
                    } catch {
                        continuation.resume(returning: .failure(TransportReason("\(error)")))
                    }
                }
                thread.detach()
            }
        } onCancel: {
            stopped.withLock { $0 = true }
        }
        return try result.get()
    }
}

/// The jobs of `CurlTransport.send`, done in order on one thread that owns the `HTTPClient`
/// (not Sendable: it never leaves that thread). The thread ends once the queue is closed and
/// empty.
private final class CallQueue: Sendable {
    typealias Job = @Sendable (inout HTTPClient?) -> Void

    private let state = Locked<(jobs: [Job], closed: Bool, running: Bool)>(([], false, false))

    func submit(_ job: @escaping Job) {
        let start = state.withLockNotifyingAll { state in
            state.jobs.append(job)
            defer { state.running = true }
            return !state.running
        }
        guard start else { return }
        let thread = WorkerThread(name: "bh-client")
        thread.start { [state] in
            var client: HTTPClient?
            while let job = state.withLock(
                when: { !$0.jobs.isEmpty || $0.closed }, { $0.jobs.isEmpty ? nil : $0.jobs.removeFirst() })
            {
                job(&client)
            }
        }
        thread.detach()
    }

    func close() { state.withLockNotifyingAll { $0.closed = true } }
}
