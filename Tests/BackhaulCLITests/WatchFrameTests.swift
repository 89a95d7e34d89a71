import BackhaulCLI
import JSON
import Testing

@Suite("watch: progress carried on between events")
struct WatchFrameTests {
    static let mib: Int64 = 1 << 20

    static func task(kind: String = "upload", moved: Int64, total: Int64?, rate: Int64) -> JSON {
        let key = kind == "download" ? "bytes_received" : "bytes_sent"
        return ["id": "tsk_a", "kind": .string(kind), "progress": [
            key: .int(moved), "bytes_total": total.map { .int($0) } ?? .null, "bytes_per_second": .int(rate),
            "fraction": total.map { .double(Double(moved) / Double($0)) } ?? .null, "eta_seconds": .null,
        ]]
    }

    @Test("moved on at the last rate, capped at the size; unchanged without a rate or time")
    func extrapolation() {
        let mib = Self.mib
        let cases: [(JSON, Double, key: String, moved: Int64, fraction: Double?, eta: Double?)] = [
            (Self.task(moved: mib, total: 4 * mib, rate: mib), 1, "bytes_sent", 2 * mib, 0.5, 2),
            (Self.task(moved: mib, total: 4 * mib, rate: mib), 10, "bytes_sent", 4 * mib, 1, 0),
            (Self.task(kind: "download", moved: 0, total: 2 * mib, rate: mib), 0.5, "bytes_received", mib / 2, 0.25, 1.5),
            (Self.task(moved: mib, total: nil, rate: mib), 2, "bytes_sent", 3 * mib, nil, nil),
            (Self.task(moved: mib, total: 4 * mib, rate: 0), 5, "bytes_sent", mib, 0.25, nil),
            (Self.task(moved: mib, total: 4 * mib, rate: mib), 0, "bytes_sent", mib, 0.25, nil),
        ]
        for (task, seconds, key, moved, fraction, eta) in cases {
            let progress = WatchFrame.extrapolated(task, by: seconds)["progress"]
            #expect(progress?[key]?.intValue == moved, "\(task.serialized()) after \(seconds) s")
            #expect(progress?["fraction"]?.doubleValue == fraction, "\(task.serialized()) after \(seconds) s")
            #expect(progress?["eta_seconds"]?.doubleValue == eta, "\(task.serialized()) after \(seconds) s")
        }
    }
}
