import BackhaulCore
import JSONCodec
import SQLite

/// A delivery ready to send: where, with which secrets, and the exact bytes.
public struct PendingDelivery: Sendable {
    public var sequence: Int64
    public var webhookID: String
    public var url: String
    public var secrets: [String]
    /// The `webhook-id`: the event's id, the same for every redelivery.
    public var eventID: String
    public var payload: [UInt8]
    public var attempts: Int

    package init(
        sequence: Int64, webhookID: String, url: String, secrets: [String], eventID: String, payload: [UInt8], attempts: Int
    ) {
        self.sequence = sequence
        self.webhookID = webhookID
        self.url = url
        self.secrets = secrets
        self.eventID = eventID
        self.payload = payload
        self.attempts = attempts
    }
}

extension Store {
    /// `session.drained` means "everything before was delivered": it waits until every earlier
    /// delivery to the same subscription has ended (in flight ones are still `pending`).
    package static let drainedIsLast = """
        (d.event_type != 'session.drained' OR NOT EXISTS (SELECT 1 FROM deliveries p
            WHERE p.webhook_id = d.webhook_id AND p.state = 'pending' AND p.seq < d.seq))
        """

    package static let webhookColumns =
        "id, session_id, url, events, secret, previous_secret, previous_secret_expires_at, enabled, disabled_reason, created_at"

    package static func decodeWebhook(_ row: some StoredRow) throws -> WebhookRecord {
        let events =
            (try JSON.parse(row.string(3))).arrayValue?.compactMap { $0.stringValue.flatMap(EventType.init(rawValue:)) } ?? []
        var webhook = WebhookRecord(
            id: row.string(0), sessionID: row.string(1), url: row.string(2), events: events,
            secret: row.string(4), createdAt: row.double(9))
        webhook.previousSecret = row.optionalString(5)
        webhook.previousSecretExpiresAt = row.optionalDouble(6)
        webhook.enabled = row.int(7) != 0
        webhook.disabledReason = row.optionalString(8)
        return webhook
    }

    static func fetchWebhook(_ db: Connection, id: String) throws -> WebhookRecord? {
        try db.queryFirst("SELECT \(webhookColumns) FROM webhooks WHERE id = ?", [id], decodeWebhook)
    }

    static func saveWebhook(_ db: Connection, _ webhook: WebhookRecord) throws {
        try db.run(
            """
            INSERT INTO webhooks (\(webhookColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (id) DO UPDATE SET url = excluded.url, events = excluded.events, secret = excluded.secret,
                previous_secret = excluded.previous_secret, previous_secret_expires_at = excluded.previous_secret_expires_at,
                enabled = excluded.enabled, disabled_reason = excluded.disabled_reason
            """,
            [
                webhook.id, webhook.sessionID, webhook.url, JSON.array(webhook.events.map { .string($0.rawValue) }).serialized(),
                webhook.secret, webhook.previousSecret, webhook.previousSecretExpiresAt, webhook.enabled, webhook.disabledReason,
                webhook.createdAt,
            ])
    }

    /// Pending deliveries of a subscription end as `abandoned`.
    static func abandonDeliveries(_ db: Connection, webhookID: String, now: Timestamp, reason: String) throws {
        try db.run(
            """
            UPDATE deliveries SET state = 'abandoned', next_attempt_at = NULL, finished_at = ?, last_error = ?
            WHERE webhook_id = ? AND state = 'pending'
            """, [now, reason, webhookID])
    }

    public func createWebhook(_ webhook: WebhookRecord) throws(StoreError) {
        try write { db in
            guard try Store.fetchSession(db, id: webhook.sessionID) != nil else { throw StoreError.notFound }
            try Store.saveWebhook(db, webhook)
        }
    }

    public func webhook(id: String) throws(StoreError) -> WebhookRecord? {
        try read { db in try Store.fetchWebhook(db, id: id) }
    }

    public func webhooks(sessionID: String) throws(StoreError) -> [WebhookRecord] {
        try read { db in
            try db.query(
                "SELECT \(Store.webhookColumns) FROM webhooks WHERE session_id = ? ORDER BY created_at, id", [sessionID],
                Store.decodeWebhook)
        }
    }

    /// Applies `change` to a subscription; re-enabling clears the reason it was disabled.
    public func updateWebhook(id: String, _ change: @escaping @Sendable (inout WebhookRecord) throws -> Void) throws
        -> WebhookRecord
    {
        let now = self.now
        return try write { db in
            guard var webhook = try Store.fetchWebhook(db, id: id) else { throw StoreError.notFound }
            let wasEnabled = webhook.enabled
            try change(&webhook)
            if webhook.enabled { webhook.disabledReason = nil }
            if wasEnabled, !webhook.enabled {
                webhook.disabledReason = webhook.disabledReason ?? "disabled by a client"
                try Store.abandonDeliveries(db, webhookID: id, now: now, reason: "the subscription was disabled")
            }
            try Store.saveWebhook(db, webhook)
            return webhook
        }
    }

    /// Removes a subscription; its pending deliveries are abandoned (their history stays listed
    /// until pruned).
    public func deleteWebhook(id: String) throws(StoreError) {
        let now = self.now
        try write { db in
            guard try Store.fetchWebhook(db, id: id) != nil else { throw StoreError.notFound }
            try Store.abandonDeliveries(db, webhookID: id, now: now, reason: "the subscription was deleted")
            try db.run("DELETE FROM webhooks WHERE id = ?", [id])
        }
    }

    public func deliveries(webhookID: String, state: DeliveryRecord.State?, cursor: String?, limit: Int) throws(StoreError)
        -> (deliveries: [DeliveryRecord], nextCursor: String?)
    {
        let after = cursor.flatMap { Int64($0) } ?? 0
        return try read { db in
            let select = Store.deliverySelect
            let rows: [DeliveryRecord]
            if let state {
                rows = try db.query(
                    "\(select) WHERE d.webhook_id = ? AND d.state = ? AND d.seq > ? ORDER BY d.seq LIMIT ?",
                    [webhookID, state.rawValue, after, limit + 1], Store.decodeDelivery)
            } else {
                rows = try db.query(
                    "\(select) WHERE d.webhook_id = ? AND d.seq > ? ORDER BY d.seq LIMIT ?",
                    [webhookID, after, limit + 1], Store.decodeDelivery)
            }
            return Store.page(rows, limit: limit)
        }
    }

    /// A subscription's deliveries with their events' ids and types, read by `decodeDelivery`.
    package static let deliverySelect = """
        SELECT d.seq, d.webhook_id, d.event_seq, e.id, e.type, d.state, d.attempts, d.next_attempt_at, d.last_status,
            d.last_error, d.history, d.created_at, d.finished_at
        FROM deliveries d JOIN events e ON e.seq = d.event_seq
        """

    package static func decodeDelivery(_ row: some StoredRow) -> DeliveryRecord {
        DeliveryRecord(
            sequence: row.int(0), webhookID: row.string(1), eventSequence: row.int(2), eventID: row.string(3),
            eventType: row.string(4), state: DeliveryRecord.State(rawValue: row.string(5)) ?? .pending,
            attempts: Int(row.int(6)), nextAttemptAt: row.optionalDouble(7), lastStatus: row.optionalInt(8).map { Int($0) },
            lastError: row.optionalString(9), history: (try? JSON.parse(row.string(10))) ?? .array([]),
            createdAt: row.double(11), finishedAt: row.optionalDouble(12))
    }

    /// A page of deliveries read with one more than `limit`: the extra one says a next page exists.
    package static func page(_ rows: [DeliveryRecord], limit: Int) -> (deliveries: [DeliveryRecord], nextCursor: String?) {
        page(rows, limit: limit, sequence: \.sequence)
    }

    /// A page from up to `limit + 1` rows read in order: the one past the limit only says there is
    /// more, and the cursor is the last kept row's sequence.
    package static func page<Row>(_ rows: [Row], limit: Int, sequence: (Row) -> Int64) -> ([Row], nextCursor: String?) {
        guard rows.count > limit else { return (rows, nil) }
        let kept = Array(rows.prefix(limit))
        return (kept, kept.last.map { String(sequence($0)) })
    }

    /// Pending deliveries due at `now`, oldest first, leaving out those already in flight.
    public func dueDeliveries(now: Timestamp, limit: Int, excluding inFlight: Set<Int64>) throws(StoreError) -> [PendingDelivery]
    {
        try read { db in
            let rows = try db.query(
                """
                SELECT d.seq, d.webhook_id, w.url, w.secret, w.previous_secret, w.previous_secret_expires_at, e.id, e.type,
                    e.created_at, e.data, d.attempts
                FROM deliveries d JOIN webhooks w ON w.id = d.webhook_id JOIN events e ON e.seq = d.event_seq
                WHERE d.state = 'pending' AND d.next_attempt_at <= ? AND \(Store.drainedIsLast)
                ORDER BY d.next_attempt_at, d.seq LIMIT ?
                """, [now, limit + inFlight.count]
            ) { row in Store.decodePendingDelivery(row, now: now) }
            return Array(rows.filter { !inFlight.contains($0.sequence) }.prefix(limit))
        }
    }

    /// A due delivery from the columns `d.seq, d.webhook_id, w.url, w.secret, w.previous_secret,
    /// w.previous_secret_expires_at, e.id, e.type, e.created_at, e.data, d.attempts`: signed with
    /// the current secret, and the previous one while it has not expired.
    package static func decodePendingDelivery(_ row: some StoredRow, now: Timestamp) -> PendingDelivery {
        var secrets = [row.string(3)]
        if let previous = row.optionalString(4), let expires = row.optionalDouble(5), expires > now {
            secrets.append(previous)
        }
        // The body is built around the stored event data, never parsed again: the same bytes
        // on every redelivery.
        let event = EventRecord(
            sequence: 0, id: row.string(6), type: row.string(7), sessionID: "", taskID: nil,
            createdAt: row.double(8), dataText: row.string(9))
        return PendingDelivery(
            sequence: row.int(0), webhookID: row.string(1), url: row.string(2), secrets: secrets,
            eventID: row.string(6), payload: Array(event.payloadText.utf8), attempts: Int(row.int(10)))
    }

    /// The earliest due time of a pending delivery that is not in flight.
    public func nextDeliveryAt(excluding inFlight: Set<Int64> = []) throws(StoreError) -> Timestamp? {
        let busy = JSON.array(inFlight.sorted().map { .int($0) }).serialized()
        return try read { db in
            try db.queryFirst(
                """
                SELECT MIN(d.next_attempt_at) FROM deliveries d
                WHERE d.state = 'pending' AND \(Store.drainedIsLast) AND d.seq NOT IN (SELECT value FROM json_each(?))
                """, [busy]
            ) { $0.optionalDouble(0) } ?? nil
        }
    }

    /// Writes one attempt's result. `gone` disables the subscription and abandons the rest.
    public func recordDeliveryAttempt(
        sequence: Int64, status: Int?, error: String?, decision: DeliveryPlan.Decision,
        done: @escaping @Sendable (StoreError?) -> Void
    ) {
        let now = self.now
        submit(
            { db in
                guard
                    let (webhookID, historyText) = try db.queryFirst(
                        "SELECT webhook_id, history FROM deliveries WHERE seq = ? AND state = 'pending'", [sequence],
                        { ($0.string(0), $0.string(1)) })
                else { return }
                let (state, next, historyJSON) = Store.attemptRecorded(
                    history: historyText, now: now, status: status, error: error, decision: decision)
                try db.run(
                    """
                    UPDATE deliveries SET state = ?, attempts = attempts + 1, next_attempt_at = ?, last_status = ?, last_error = ?,
                        history = ?, finished_at = ?
                    WHERE seq = ?
                    """,
                    [state.rawValue, next, status, error, historyJSON, state == .pending ? nil : now, sequence])
                if decision == .gone {
                    try db.run(
                        "UPDATE webhooks SET enabled = 0, disabled_reason = ? WHERE id = ?",
                        ["the receiver answered 410 Gone", webhookID])
                    try Store.abandonDeliveries(db, webhookID: webhookID, now: now, reason: "the receiver answered 410 Gone")
                }
            },
            done: { result in
                if case .failure(let error) = result { done(error) } else { done(nil) }
            })
    }

    /// What an attempt's result makes of a delivery: its state, its next attempt, and its
    /// history (the last 20 attempts) with this one appended.
    package static func attemptRecorded(
        history text: String, now: Timestamp, status: Int?, error: String?, decision: DeliveryPlan.Decision
    ) -> (state: DeliveryRecord.State, next: Timestamp?, history: String) {
        var history = (try? JSON.parse(text))?.arrayValue ?? []
        history.append([
            "at": .string(RFC3339.format(now)), "status": status.map { .int(Int64($0)) } ?? .null,
            "error": error.map { .string($0) } ?? .null,
        ])
        let (state, next): (DeliveryRecord.State, Timestamp?) =
            switch decision {
            case .delivered: (.delivered, nil)
            case .retry(let at): (.pending, at)
            case .failed: (.failed, nil)
            case .gone: (.abandoned, nil)
            }
        return (state, next, JSON.array(Array(history.suffix(20))).serialized())
    }

    /// Deliveries by state (metrics). Finished ones are pruned after the retention period.
    public func deliveryCounts() throws(StoreError) -> [DeliveryRecord.State: Int] {
        try read { db in
            var counts: [DeliveryRecord.State: Int] = [:]
            for (state, count) in try db.query(
                "SELECT state, COUNT(*) FROM deliveries GROUP BY state", [],
                {
                    ($0.string(0), Int($0.int(1)))
                })
            {
                if let state = DeliveryRecord.State(rawValue: state) { counts[state] = count }
            }
            return counts
        }
    }
}
