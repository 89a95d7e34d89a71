import BackhaulCore
import JSONCodec
import SQLite

/// An event written in the same transaction as the state change that caused it (OpenAPI/backhaul.yaml).
public struct EventRecord: Sendable, Equatable {
    public var sequence: Int64
    public var id: String
    public var type: String
    public var sessionID: String
    public var taskID: String?
    public var createdAt: Timestamp
    /// The event's data as stored: serialized once, when the event was written.
    public var dataText: String

    /// The Standard Webhooks payload `{"type","timestamp","data"}`, built around the stored data
    /// without parsing it again: the same bytes for every delivery and every stream.
    public var payloadText: String {
        "{\"type\":\"\(type)\",\"timestamp\":\"\(RFC3339.format(createdAt))\",\"data\":\(dataText)}"
    }

    /// The payload as a value (tests and tools; the daemon sends `payloadText`).
    public var payload: JSON { (try? JSON.parse(payloadText, maxDepth: 64)) ?? .null }
}

extension Store {
    /// The newest event's sequence (0 when there is none).
    public func lastEventSequence() throws(StoreError) -> Int64 {
        try read { db in try db.queryFirst("SELECT COALESCE(MAX(seq), 0) FROM events") { $0.int(0) } ?? 0 }
    }

    /// Events after `sequence`, oldest first: of one session, of the sessions `sessions` allows
    /// (a client token's scope), or all.
    public func events(
        after sequence: Int64, session: String? = nil, limit: Int = 500,
        sessions allowed: (@Sendable (String) -> Bool)? = nil
    ) throws(StoreError) -> [EventRecord] {
        try read { db in
            let map: (Row) throws -> EventRecord = { row in
                EventRecord(
                    sequence: row.int(0), id: row.string(1), type: row.string(2), sessionID: row.string(3),
                    taskID: row.optionalString(4), createdAt: row.double(5), dataText: row.string(6))
            }
            let columns = "seq, id, type, session_id, task_id, created_at, data"
            if let session {
                return try db.query(
                    "SELECT \(columns) FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    [session, sequence, limit], map)
            }
            guard let allowed else {
                return try db.query("SELECT \(columns) FROM events WHERE seq > ? ORDER BY seq LIMIT ?", [sequence, limit], map)
            }
            // A client sees its own sessions' events: filtered here, page by page.
            var result: [EventRecord] = []
            var cursor = sequence
            while result.count < limit {
                let page = try db.query("SELECT \(columns) FROM events WHERE seq > ? ORDER BY seq LIMIT ?", [cursor, limit], map)
                guard let last = page.last else { break }
                cursor = last.sequence
                result += page.filter { allowed($0.sessionID) }
            }
            return Array(result.prefix(limit))
        }
    }
}
