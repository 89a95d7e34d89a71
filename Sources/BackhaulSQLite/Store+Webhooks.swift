import BackhaulCore
import BackhaulStore
import JSONCodec
import SQLite

extension Store {
    static func fetchWebhook(_ db: Connection, id: String) throws -> WebhookRecord? {
        try db.queryFirst("SELECT \(StoreRules.webhookColumns) FROM webhooks WHERE id = ?", [id], StoreRules.decodeWebhook)
    }

    static func saveWebhook(_ db: Connection, _ webhook: WebhookRecord) throws {
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
                "SELECT \(StoreRules.webhookColumns) FROM webhooks WHERE session_id = ? ORDER BY created_at, id", [sessionID],
                StoreRules.decodeWebhook)
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
            let select = StoreRules.deliverySelect
            let rows: [DeliveryRecord]
            if let state {
                rows = try db.query(
                    "\(select) WHERE d.webhook_id = ? AND d.state = ? AND d.seq > ? ORDER BY d.seq LIMIT ?",
                    [webhookID, state.rawValue, after, limit + 1], StoreRules.decodeDelivery)
            } else {
                rows = try db.query(
                    "\(select) WHERE d.webhook_id = ? AND d.seq > ? ORDER BY d.seq LIMIT ?",
                    [webhookID, after, limit + 1], StoreRules.decodeDelivery)
            }
            return StoreRules.page(rows, limit: limit)
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
                let (state, next, historyJSON) = StoreRules.attemptRecorded(
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
