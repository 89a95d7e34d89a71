import BackhaulCore
import BackhaulQueue
import JSONCodec
import SQLite

extension Store {
    static func fetchWebhook(_ db: Connection, id: String) throws -> WebhookRecord? {
        try db.queryFirst("SELECT \(StoreRules.webhookColumns) FROM webhooks WHERE id = ?", [id], StoreRules.decodeWebhook)
    }

    public func saveWebhook(_ db: Connection, _ webhook: WebhookRecord) throws {
        try db.run(
            """
            INSERT INTO webhooks (\(StoreRules.webhookColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
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
    public func abandonDeliveries(_ db: Connection, webhookID: String, now: Timestamp, reason: String) throws {
        try db.run(
            """
            UPDATE deliveries SET state = 'abandoned', next_attempt_at = NULL, finished_at = ?, last_error = ?
            WHERE webhook_id = ? AND state = 'pending'
            """, [now, reason, webhookID])
    }

    public func webhook(id: String) throws(StoreError) -> WebhookRecord? {
        try read { db in try Store.fetchWebhook(db, id: id) }
    }

    public func webhooks(sessionID: String) throws(StoreError) -> [WebhookRecord] {
        try read { db in
            try db.query(
                "SELECT \(StoreRules.webhookColumns) FROM webhooks WHERE session_id = ? ORDER BY created_at, id", [sessionID],
                StoreRules.decodeWebhook)
        }
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
                WHERE d.state = 'pending' AND d.next_attempt_at <= ? AND \(StoreRules.drainedIsLast)
                ORDER BY d.next_attempt_at, d.seq LIMIT ?
                """, [now, limit + inFlight.count]
            ) { row in StoreRules.decodePendingDelivery(row, now: now) }
            return Array(rows.filter { !inFlight.contains($0.sequence) }.prefix(limit))
        }
    }

    /// The earliest due time of a pending delivery that is not in flight.
    public func nextDeliveryAt(excluding inFlight: Set<Int64> = []) throws(StoreError) -> Timestamp? {
        let busy = JSON.array(inFlight.sorted().map { .int($0) }).serialized()
        return try read { db in
            try db.queryFirst(
                """
                SELECT MIN(d.next_attempt_at) FROM deliveries d
                WHERE d.state = 'pending' AND \(StoreRules.drainedIsLast) AND d.seq NOT IN (SELECT value FROM json_each(?))
                """, [busy]
            ) { $0.optionalDouble(0) } ?? nil
        }
    }

    /// Deliveries by state (metrics). Finished ones are pruned after the retention period.
    public func deliveryCounts() throws(StoreError) -> [DeliveryRecord.State: Int] {
        try read { db in
            try StoreRules.counts(
                db.query("SELECT state, COUNT(*) FROM deliveries GROUP BY state", [], { ($0.string(0), Int($0.int(1))) }))
        }
    }
}
