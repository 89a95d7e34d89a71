import BackhaulClient
import Threads

/// A transport that answers from a table (`"GET /v1/tasks/tsk_a"` → status and body) and records
/// every request; a missing entry is a transport failure. A stream hands out `streamChunks` one by
/// one, then fails with `streamFailure` if set. For the decoding tests: the calls themselves are
/// tested against a real daemon in LiveDaemonTests.
final class CannedTransport: APITransport {
    private struct State {
        var answers: [String: APIResponse] = [:]
        var streamChunks: [String] = []
        var streamFailure: String?
        var requests: [APIRequest] = []
    }
    private let state = Locked(State())

    init(_ answers: [String: (Int, String)] = [:]) {
        state.withLock { state in
            for (key, (status, body)) in answers { state.answers[key] = APIResponse(status: status, body: Array(body.utf8)) }
        }
    }

    static let base = "http://127.0.0.1:8427"

    var requests: [APIRequest] { state.withLock { $0.requests } }

    /// `METHOD /path?query` of each request, in order.
    var sent: [String] { requests.map { "\($0.method) \($0.url.dropFirst(CannedTransport.base.count))" } }

    func answer(_ key: String, _ status: Int, _ body: String) {
        state.withLock { $0.answers[key] = APIResponse(status: status, body: Array(body.utf8)) }
    }

    func streaming(_ chunks: [String], failure: String? = nil) {
        state.withLock {
            $0.streamChunks = chunks
            $0.streamFailure = failure
        }
    }

    func send(_ request: APIRequest) async throws(TransportReason) -> APIResponse {
        let key = "\(request.method) \(request.url.dropFirst(Self.base.count))"
        let answer = state.withLock { state in
            state.requests.append(request)
            return state.answers[key]
        }
        guard let answer else { throw TransportReason("curl error 7: Could not connect to server") }
        return answer
    }

    func stream(_ request: APIRequest, receive: @escaping @Sendable ([UInt8]) -> Void) async throws(TransportReason)
        -> APIResponse
    {
        let (answer, chunks, failure) = state.withLock { state in
            state.requests.append(request)
            return (state.answers["GET \(request.url.dropFirst(Self.base.count))"], state.streamChunks, state.streamFailure)
        }
        if let answer, answer.status != 200 { return answer }
        for chunk in chunks { receive(Array(chunk.utf8)) }
        if let failure { throw TransportReason(failure) }
        return APIResponse(status: 200, body: [])
    }
}
