import BackhaulCLI
import BackhaulClient
import JSONCodec
import Testing

@Suite("watch: progress carried on between events, and the frame")
struct WatchFrameTests {
    static let mib: Int64 = 1 << 20

    static func task(id: String = "tsk_a", kind: String = "upload", moved: Int64, total: Int64?, rate: Int64, eta: Double? = nil)
        throws -> APITask
    {
        let key = kind == "download" ? "bytes_received" : "bytes_sent"
        let other = kind == "download" ? "bytes_sent" : "bytes_received"
        let object: JSON = [
            "id": .string(id), "session_id": "cli", "kind": .string(kind), "state": "running", "attempts": 1,
            "created_at": "2026-11-20T10:00:00Z", "request": ["url": "https://in.example/a.bin"],
            kind == "download" ? "download" : "file": kind == "download" ? ["destination": "/d/a.bin"] : ["path": "/d/a.bin"],
            "progress": [
                key: .int(moved), other: 0, "bytes_total": total.map { .int($0) } ?? .null, "bytes_per_second": .int(rate),
                "fraction": total.map { .double(Double(moved) / Double($0)) } ?? 0,
                "eta_seconds": eta.map { .double($0) } ?? .null,
            ],
        ]
        return try decoded(object.serialized())
    }

    @Test("moved on at the last rate, capped at the size; unchanged without a rate or time")
    func extrapolation() throws {
        let mib = Self.mib
        let cases: [(APITask, Double, download: Bool, moved: Int64, fraction: Double, eta: Double?)] = [
            (try Self.task(moved: mib, total: 4 * mib, rate: mib), 1, false, 2 * mib, 0.5, 2),
            (try Self.task(moved: mib, total: 4 * mib, rate: mib), 10, false, 4 * mib, 1, 0),
            (try Self.task(kind: "download", moved: 0, total: 2 * mib, rate: mib), 0.5, true, mib / 2, 0.25, 1.5),
            (try Self.task(moved: mib, total: nil, rate: mib), 2, false, 3 * mib, 0, nil),
            (try Self.task(moved: mib, total: 4 * mib, rate: 0), 5, false, mib, 0.25, nil),
            (try Self.task(moved: mib, total: 4 * mib, rate: mib), 0, false, mib, 0.25, nil),
        ]
        for (task, seconds, download, moved, fraction, eta) in cases {
            let progress = WatchFrame.extrapolated(task, by: seconds).progress
            let comment = Comment(rawValue: "\(task.id) after \(seconds) s")
            #expect((download ? progress.bytesReceived : progress.bytesSent) == moved, comment)
            #expect((download ? progress.bytesSent : progress.bytesReceived) == 0, comment)
            #expect(progress.fraction == fraction, comment)
            #expect(progress.etaSeconds == eta, comment)
        }
    }

    @Test("one line per running task with bar, bytes, rate and ETA; the counts in a fixed order")
    func frame() throws {
        let task = try Self.task(moved: Self.mib, total: 2 * Self.mib, rate: Self.mib / 2, eta: 2)
        #expect(
            WatchFrame.render(running: [task], counts: [.running: 1, .queued: 3])
                == "tsk_a  a.bin  [##########..........] 50%  1.0 MiB/2.0 MiB  512.0 KiB/s  ETA 2s\n"
                + "1 running, 3 queued, 0 waiting, 0 retrying, 0 suspended, 0 auth_required, 0 completed, 0 failed, 0 cancelled")
        let download = try Self.task(id: "tsk_d", kind: "download", moved: 300, total: nil, rate: 0)
        #expect(
            WatchFrame.render(running: [download], counts: [:]).hasPrefix(
                "tsk_d  a.bin  [....................] 0%  300 B/0 B  -  ETA -\n"))
    }
}
