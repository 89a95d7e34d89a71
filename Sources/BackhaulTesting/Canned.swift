/// API objects as the daemon writes them, for the client's and the command line's decoding tests.
public enum Canned {
    public static func task(id: String = "tsk_a", state: String = "running", kind: String = "upload", extra: String = "")
        -> String
    {
        let local =
            kind == "upload"
            ? #""file": {"path": "/data/clip.bin", "size": 4096, "modified_at": "2026-11-20T10:00:00Z"}, "download": null, "upload": {"protocol": "chunked", "chunk_size": 1024}"#
            : #""file": null, "upload": null, "download": {"destination": "/data/map.tiles", "overwrite": false, "expected_sha256": null}"#
        let progress =
            kind == "upload"
            ? #"{"bytes_sent": 1024, "bytes_received": 0, "bytes_total": 4096, "fraction": 0.25, "bytes_per_second": 512, "eta_seconds": 6.0}"#
            : #"{"bytes_sent": 0, "bytes_received": 300, "bytes_total": null, "fraction": 0, "bytes_per_second": 0, "eta_seconds": null}"#
        // A member the extra members give is left out of the rest: the daemon never repeats a key.
        var object = """
            {"id": "\(id)", "session_id": "cli", "kind": "\(kind)", "state": "\(state)", "waiting_reason": null, \(local),
             "request": {"url": "https://ingest.example/clips/clip.bin", "method": "PUT", "headers": {}},
             "priority": 0.5, "description": null, "idempotency_key": null, "delete_file_on_success": false, "configuration": {},
             "attempts": 2, "progress": \(progress), "created_at": "2026-11-20T10:00:01Z", "started_at": null, "finished_at": null,
             "next_attempt_at": null, "earliest_begin_at": null, "response": null, "error": null, "last_error": null,
             "cancellation": null\(extra)}
            """
        for key in ["waiting_reason", "next_attempt_at", "response", "error", "last_error"] where extra.contains("\"\(key)\":") {
            object = object.replacing("\"\(key)\": null,", with: "")
        }
        return object
    }

    public static let problem404 =
        #"{"type": "https://backhaul.dev/problems/not_found", "title": "No such resource", "status": 404, "code": "not_found", "detail": "no task tsk_nope"}"#

    public static let session = """
        {"id": "cli", "configuration": {}, "enabled": true, "state": "active", "created_at": "2026-11-20T10:00:00Z",
         "task_counts": {"queued": 1, "waiting": 0, "running": 2, "retrying": 0, "suspended": 0, "auth_required": 0,
                         "completed": 7, "failed": 1, "cancelled": 0}}
        """
}
