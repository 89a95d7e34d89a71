import BackhaulCore
import JSON
import SQLite

extension Store {
    /// Cleanup requests due now (tus termination after a cancel).
    public func dueCleanups(now: Timestamp, limit: Int, excluding busy: Set<Int64>) throws(StoreError) -> [(Int64, PlannedRequest, Int)] {
        try read { db in
            try db.query("SELECT seq, request, attempts FROM cleanups WHERE next_attempt_at <= ? ORDER BY seq LIMIT ?",
                         [now, limit + busy.count]) { row -> (Int64, PlannedRequest, Int)? in
                guard !busy.contains(row.int(0)), let value = try? JSON.parse(row.string(1)) else { return nil }
                var headers: [(String, String)] = []
                for (name, header) in value["headers"]?.objectValue ?? [:] { headers.append((name, header.stringValue ?? "")) }
                return (row.int(0), PlannedRequest(method: value["method"]?.stringValue ?? "DELETE", url: value["url"]?.stringValue ?? "",
                                                   headers: headers, body: .empty), Int(row.int(2)))
            }.compactMap { $0 }.prefix(limit).map { $0 }
        }
    }

    /// A cleanup succeeded or was given up (`retryAt` nil), or is tried again later.
    public func recordCleanup(sequence: Int64, retryAt: Timestamp?) throws(StoreError) {
        try write(.relaxed) { db in
            if let retryAt {
                try db.run("UPDATE cleanups SET attempts = attempts + 1, next_attempt_at = ? WHERE seq = ?", [retryAt, sequence])
            } else {
                try db.run("DELETE FROM cleanups WHERE seq = ?", [sequence])
            }
        }
    }
}
