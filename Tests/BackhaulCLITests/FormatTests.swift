import BackhaulClient
import BackhaulTesting
import Foundation
import Testing

@testable import BackhaulCLI

@Suite("Command-line output: task rows, error lines, attempts, show, exit statuses")
struct FormatTests {
    static func task(_ state: String, extra: String = "") throws -> APITask {
        try decoded(Canned.task(state: state, extra: extra))
    }

    static let lastError = """
        , "last_error": {"code": -1004, "name": "cannot_connect_to_host", "message": "Connection refused", "http_status": null,
                         "at": "2026-11-20T10:00:09.000Z"}
        """

    @Test("a row marks an unfinished task whose latest attempt failed with `! name`; a finished one shows its error")
    func rows() throws {
        #expect(
            Format.taskRow(try Self.task("retrying", extra: Self.lastError))
                == ["tsk_a", "retrying ! cannot_connect_to_host", "25%", "4.0 KiB", "https://ingest.example/clips/clip.bin"])
        let failed = """
            , "error": {"code": -1011, "name": "bad_server_response", "message": "503", "http_status": 503}
            """ + Self.lastError
        #expect(Format.taskRow(try Self.task("failed", extra: failed))[1] == "failed bad_server_response")
        #expect(
            Format.taskRow(try Self.task("waiting", extra: #", "waiting_reason": "no_connectivity""#))[1]
                == "waiting (no_connectivity)")
    }

    @Test("a background task says it yields: the rate it paces at and the queue it measures (ls and watch)")
    func background() throws {
        var task = try Self.task("running")
        task.progress.background = .init(rateBytesPerSecond: 4_300_000, queueDelayMilliseconds: 3.4)
        #expect(Format.taskRow(task)[1] == "running (background: \(Format.rate(4_300_000)), queue 3 ms)")
        #expect(WatchFrame.render(running: [task], counts: [:]).contains("  (background: \(Format.rate(4_300_000)), queue 3 ms)"))
    }

    @Test("show: the last error unless it is the error the task ended with; the response; aligned values")
    func show() throws {
        let text = Show.describe(
            try Self.task("retrying", extra: Self.lastError + #", "next_attempt_at": "2026-11-20T10:00:39.000Z""#))
        #expect(
            text == """
                id:         tsk_a
                session:    cli
                state:      retrying
                kind:       upload
                file:       /data/clip.bin
                url:        https://ingest.example/clips/clip.bin
                protocol:   chunked
                progress:   1.0 KiB of 4.0 KiB
                attempts:   2
                last error: -1004 cannot_connect_to_host: Connection refused at 2026-11-20T10:00:09.000Z
                next try:   2026-11-20T10:00:39.000Z
                """)
        let failed = """
            , "error": {"code": -1004, "name": "cannot_connect_to_host", "message": "Connection refused", "http_status": null},
            "response": {"status": 503, "headers": {}, "body": "", "body_encoding": "utf8"}
            """ + Self.lastError
        let shown = Show.describe(try Self.task("failed", extra: failed))
        #expect(shown.contains("error:      -1004 cannot_connect_to_host: Connection refused") && !shown.contains("last error"))
        #expect(shown.hasSuffix("response:   HTTP 503"))
    }

    @Test("the attempt table: how long each took, bytes moved, outcome, error")
    func attempts() throws {
        let attempt: APIAttempt = try decoded(
            """
            {"number": 2, "started_at": "2026-11-20T10:00:05.250Z", "ended_at": "2026-11-20T10:01:10.250Z", "bytes_sent": 2048,
             "bytes_received": 0, "outcome": "retry", "http_status": 503,
             "error": {"code": -1011, "name": "bad_server_response", "message": "503", "http_status": 503}}
            """)
        #expect(
            Format.attempts([attempt]) == """
                #  STARTED              TOOK  MOVED    OUTCOME  ERROR
                2  2026-11-20 10:00:05  1m5s  2.0 KiB  retry    bad_server_response (HTTP 503)
                """)
    }

    @Test("API errors end the command with their exit status and message")
    func exitStatuses() {
        let refused = CLIError(.problem(APIProblem(status: 404, code: .notFound, detail: "no task tsk_nope")))
        #expect(refused.status == .refused && refused.description == "no task tsk_nope (not_found)")
        let unreachable = CLIError(.transport(TransportFailure(baseURL: "http://127.0.0.1:9", reason: "curl error 7: refused")))
        #expect(
            unreachable.status == .unreachable
                && unreachable.description == "cannot reach backhauld at http://127.0.0.1:9: curl error 7: refused")
        #expect(CLIError(.unexpectedAnswer("state is missing")).status == .refused)
    }
}

/// An API object read as the client library reads it.
func decoded<T: Decodable>(_ text: String, as type: T.Type = T.self) throws -> T {
    try JSONDecoder().decode(T.self, from: Data(text.utf8))
}
