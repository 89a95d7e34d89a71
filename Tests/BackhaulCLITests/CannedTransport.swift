import BackhaulCLI

/// A transport that answers from a table (`"GET /v1/tasks/tsk_a"` → status and body) and records
/// every request; a missing entry is a transport failure. A stream hands out `streamChunks` one by
/// one, then fails with `streamFailure` if set.
final class CannedTransport: APITransport {
    var answers: [String: APIResponse] = [:]
    var streamChunks: [String] = []
    var streamFailure: String?
    private(set) var requests: [APIRequest] = []

    init(_ answers: [String: (Int, String)] = [:]) {
        for (key, (status, body)) in answers { self.answers[key] = APIResponse(status: status, body: Array(body.utf8)) }
    }

    /// `METHOD /path?query` of each request, in order.
    var sent: [String] {
        requests.map { "\($0.method) \($0.url.dropFirst(CannedTransport.base.count))" }
    }

    static let base = "http://127.0.0.1:8427"

    func send(_ request: APIRequest) throws(TransportReason) -> APIResponse {
        requests.append(request)
        let key = "\(request.method) \(request.url.dropFirst(Self.base.count))"
        guard let answer = answers[key] else { throw TransportReason("curl error 7: Could not connect to server") }
        return answer
    }

    func stream(_ request: APIRequest, receive: @escaping (UnsafeRawBufferPointer) -> Bool, tick: @escaping () -> Bool)
        throws(TransportReason) -> APIResponse
    {
        requests.append(request)
        if let answer = answers["GET \(request.url.dropFirst(Self.base.count))"], answer.status != 200 { return answer }
        for chunk in streamChunks {
            let keepGoing = Array(chunk.utf8).withUnsafeBytes { receive($0) }
            guard keepGoing else { return APIResponse(status: 200, body: []) }
        }
        if let streamFailure { throw TransportReason(streamFailure) }
        return APIResponse(status: 200, body: [])
    }
}

/// Canned API objects, shaped as the daemon writes them (BackhaulCore's `json`).
enum Canned {
    static func task(id: String = "tsk_a", state: String = "running", kind: String = "upload", extra: String = "") -> String {
        let local =
            kind == "upload"
            ? #""file": {"path": "/data/clip.bin", "size": 4096, "modified_at": "2026-11-20T10:00:00Z"}, "download": null, "upload": {"protocol": "chunked", "chunk_size": 1024}"#
            : #""file": null, "upload": null, "download": {"destination": "/data/map.tiles", "overwrite": false, "expected_sha256": null}"#
        let progress =
            kind == "upload"
            ? #"{"bytes_sent": 1024, "bytes_received": 0, "bytes_total": 4096, "fraction": 0.25, "bytes_per_second": 512, "eta_seconds": 6.0}"#
            : #"{"bytes_sent": 0, "bytes_received": 300, "bytes_total": null, "fraction": 0, "bytes_per_second": 0, "eta_seconds": null}"#
        return """
            {"id": "\(id)", "session_id": "cli", "kind": "\(kind)", "state": "\(state)", "waiting_reason": null, \(local),
             "request": {"url": "https://ingest.example/clips/clip.bin", "method": "PUT", "headers": {}},
             "priority": 0.5, "description": null, "idempotency_key": null, "delete_file_on_success": false, "configuration": {},
             "attempts": 2, "progress": \(progress), "created_at": "2026-11-20T10:00:01Z", "started_at": null, "finished_at": null,
             "next_attempt_at": null, "earliest_begin_at": null, "response": null, "error": null, "last_error": null,
             "cancellation": null\(extra)}
            """
    }

    static let problem404 =
        #"{"type": "https://backhaul.dev/problems/not_found", "title": "No such resource", "status": 404, "code": "not_found", "detail": "no task tsk_nope"}"#

    static let session = """
        {"id": "cli", "configuration": {}, "enabled": true, "state": "active", "created_at": "2026-11-20T10:00:00Z",
         "task_counts": {"queued": 1, "waiting": 0, "running": 2, "retrying": 0, "suspended": 0, "auth_required": 0,
                         "completed": 7, "failed": 1, "cancelled": 0}}
        """
}
