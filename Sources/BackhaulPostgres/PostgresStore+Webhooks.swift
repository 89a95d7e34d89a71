import BackhaulCore
import BackhaulQueue
import JSONCodec
import PostgreSQL

/// Webhook subscriptions and the outbox, as `Store+Webhooks` keeps them for SQLite, with the
/// fleet's rule (docs/fleet.md): a delivery is sent by one node at a time. A node claims the due
/// deliveries it is about to send for a lease (`claimed_by`, `claim_expires_at`, the database's
/// clock), the rows it reads locked and those another node is claiming at that moment skipped;
/// recording the attempt ends the claim. A node that stops lets its claims run out, and another
/// sends them, with the same `webhook-id` (the event's id). `session.drained` still waits for
/// every earlier delivery of its subscription (`StoreRules.drainedIsLast`), whichever node has them.
extension PostgresStore {
    static let webhookInsert = """
        INSERT INTO webhooks (\(StoreRules.webhookColumns)) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
        ON CONFLICT (id) DO UPDATE SET url = excluded.url, events = excluded.events, secret = excluded.secret,
            previous_secret = excluded.previous_secret, previous_secret_expires_at = excluded.previous_secret_expires_at,
            enabled = excluded.enabled, disabled_reason = excluded.disabled_reason
        """

    func fetchWebhook(_ tx: PostgresTransaction, id: String, lock: Bool) throws -> WebhookRecord? {
        try tx.first(
            "SELECT \(StoreRules.webhookColumns) FROM webhooks WHERE id = $1\(lock ? " FOR UPDATE" : "")", [.text(id)],
            StoreRules.decodeWebhook)
    }

    public func saveWebhook(_ tx: PostgresTransaction, _ webhook: WebhookRecord) throws {
        try tx.execute(
            Self.webhookInsert,
            [
                .text(webhook.id), .text(webhook.sessionID), .text(webhook.url),
                .text(JSON.array(webhook.events.map { .string($0.rawValue) }).serialized()), .text(webhook.secret),
                .text(webhook.previousSecret), .double(webhook.previousSecretExpiresAt), .flag(webhook.enabled),
                .text(webhook.disabledReason), .double(webhook.createdAt),
            ])
    }

    /// Pending deliveries of a subscription end as `abandoned`, their claims with them.
    public func abandonDeliveries(_ tx: PostgresTransaction, webhookID: String, now: Timestamp, reason: String) throws {
        try tx.execute(
            """
            UPDATE deliveries SET state = 'abandoned', next_attempt_at = NULL, finished_at = $1, last_error = $2,
                claimed_by = NULL, claim_expires_at = NULL
            WHERE webhook_id = $3 AND state = 'pending'
            """, [.double(now), .text(reason), .text(webhookID)])
    }

    public func webhook(id: String) throws(StoreError) -> WebhookRecord? {
        try read { tx in try fetchWebhook(tx, id: id, lock: false) }
    }

    /// The session's subscriptions, oldest first (ids compared byte by byte, as SQLite does).
    public func webhooks(sessionID: String) throws(StoreError) -> [WebhookRecord] {
        try read { tx in
            try tx.rows(
                "SELECT \(StoreRules.webhookColumns) FROM webhooks WHERE session_id = $1 ORDER BY created_at, id COLLATE \"C\"",
                [.text(sessionID)], StoreRules.decodeWebhook)
        }
    }

    /// Claims the pending deliveries due at `now` for this node, oldest first, leaving out those
    /// in flight here, and returns them. A delivery another node holds under a live claim, or is
    /// claiming at this moment, is left to it. The claims of those in flight here are renewed, so
    /// a slow receiver does not let another node send the same delivery beside this one.
    public func dueDeliveries(now: Timestamp, limit: Int, excluding inFlight: Set<Int64>) throws(StoreError)
        -> [PendingDelivery]
    {
        let busy = PostgresValue.array(inFlight.sorted())
        return try write { [self] tx in
            let lease = PostgresValue.double(options.leaseSeconds)
            if !inFlight.isEmpty {
                try tx.execute(
                    """
                    UPDATE deliveries SET claim_expires_at = clock_timestamp() + make_interval(secs => $3)
                    WHERE seq = ANY($1::bigint[]) AND claimed_by = $2 AND state = 'pending'
                    """, [busy, .text(node), lease])
            }
            guard limit > 0 else { return [] }
            let claimed = try tx.rows(
                """
                WITH due AS (
                    SELECT d.seq FROM deliveries d
                    WHERE d.state = 'pending' AND d.next_attempt_at <= $1
                        AND (d.claimed_by IS NULL OR d.claimed_by = $2 OR d.claim_expires_at <= clock_timestamp())
                        AND NOT (d.seq = ANY($3::bigint[])) AND \(StoreRules.drainedIsLast)
                        AND EXISTS (SELECT 1 FROM webhooks w WHERE w.id = d.webhook_id)
                        AND EXISTS (SELECT 1 FROM events e WHERE e.seq = d.event_seq)
                    ORDER BY d.next_attempt_at, d.seq LIMIT $4
                    FOR UPDATE SKIP LOCKED
                )
                UPDATE deliveries d SET claimed_by = $2, claim_expires_at = clock_timestamp() + make_interval(secs => $5)
                FROM due, webhooks w, events e
                WHERE d.seq = due.seq AND w.id = d.webhook_id AND e.seq = d.event_seq
                RETURNING d.seq, d.webhook_id, w.url, w.secret, w.previous_secret, w.previous_secret_expires_at, e.id, e.type,
                    e.created_at, e.data, d.attempts, d.next_attempt_at
                """, [.double(now), .text(node), busy, .int(limit), lease]
            ) { row in (delivery: StoreRules.decodePendingDelivery(row, now: now), due: row.double(11)) }
            return claimed.sorted { ($0.due, $0.delivery.sequence) < ($1.due, $1.delivery.sequence) }.map(\.delivery)
        }
    }

    /// The earliest time a pending delivery not in flight here may be sent from this node: its due
    /// time, or, while another node's claim on it holds, the end of that claim (so that this node
    /// looks again when a stopped node's claim runs out).
    public func nextDeliveryAt(excluding inFlight: Set<Int64>) throws(StoreError) -> Timestamp? {
        let now = self.now
        return try read { tx in
            try tx.first(
                """
                SELECT min(CASE WHEN d.claimed_by IS NOT NULL AND d.claimed_by != $1 AND d.claim_expires_at > clock_timestamp()
                    THEN greatest(d.next_attempt_at,
                        $3::double precision + extract(epoch FROM d.claim_expires_at - clock_timestamp())::double precision)
                    ELSE d.next_attempt_at END)
                FROM deliveries d
                WHERE d.state = 'pending' AND \(StoreRules.drainedIsLast) AND NOT (d.seq = ANY($2::bigint[]))
                """, [.text(node), .array(inFlight.sorted()), .double(now)]
            ) { $0.optionalDouble(0) } ?? nil
        }
    }

    /// Deliveries by state (metrics). Finished ones are pruned after the retention period.
    public func deliveryCounts() throws(StoreError) -> [DeliveryRecord.State: Int] {
        try read { tx in
            try StoreRules.counts(
                tx.rows("SELECT state, count(*) FROM deliveries GROUP BY state", [], { ($0.string(0), Int($0.int(1))) }))
        }
    }
}
