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

    package init(
        sequence: Int64, id: String, type: String, sessionID: String, taskID: String?, createdAt: Timestamp, dataText: String
    ) {
        self.sequence = sequence
        self.id = id
        self.type = type
        self.sessionID = sessionID
        self.taskID = taskID
        self.createdAt = createdAt
        self.dataText = dataText
    }

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
            let select = "SELECT \(Store.eventColumns) FROM events"
            if let session {
                return try db.query(
                    "\(select) WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?", [session, sequence, limit],
                    Store.decodeEvent)
            }
            guard let allowed else {
                return try db.query("\(select) WHERE seq > ? ORDER BY seq LIMIT ?", [sequence, limit], Store.decodeEvent)
            }
            return try Store.events(after: sequence, limit: limit, allowed: allowed) { cursor in
                try db.query("\(select) WHERE seq > ? ORDER BY seq LIMIT ?", [cursor, limit], Store.decodeEvent)
            }
        }
    }

    package static let eventColumns = "seq, id, type, session_id, task_id, created_at, data"

    package static func decodeEvent(_ row: some StoredRow) -> EventRecord {
        EventRecord(
            sequence: row.int(0), id: row.string(1), type: row.string(2), sessionID: row.string(3),
            taskID: row.optionalString(4), createdAt: row.double(5), dataText: row.string(6))
    }

    /// The events after `sequence` of the sessions `allowed` lets through (a client sees its own
    /// sessions' events), read page by page with `page` (the events after a sequence, oldest first)
    /// and filtered here, up to `limit`.
    package static func events(
        after sequence: Int64, limit: Int, allowed: (String) -> Bool, page: (Int64) throws -> [EventRecord]
    ) rethrows -> [EventRecord] {
        var result: [EventRecord] = []
        var cursor = sequence
        while result.count < limit {
            let events = try page(cursor)
            guard let last = events.last else { break }
            cursor = last.sequence
            result += events.filter { allowed($0.sessionID) }
        }
        return Array(result.prefix(limit))
    }
}
