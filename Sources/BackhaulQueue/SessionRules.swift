import BackhaulCore

/// What the rules need of a database for sessions and webhook subscriptions, besides `StoreDriver`.
public protocol SessionDriver: StoreDriver {
    /// The session, held for this transaction's change where the database holds rows.
    func lockedSessionRecord(_ tx: Transaction, id: String) throws -> SessionRecord?
    func saveSession(_ tx: Transaction, _ session: SessionRecord) throws
    /// The session's unfinished tasks in creation order, held.
    func unfinishedTasks(_ tx: Transaction, sessionID: String) throws -> [TaskRecord]
    /// The ids and overrides (JSON text) of the session's unfinished tasks that have overrides.
    func unfinishedOverrides(_ tx: Transaction, sessionID: String) throws -> [(String, String)]

    /// The subscription, held.
    func lockedWebhook(_ tx: Transaction, id: String) throws -> WebhookRecord?
    func saveWebhook(_ tx: Transaction, _ webhook: WebhookRecord) throws
    func deleteWebhookRow(_ tx: Transaction, id: String) throws
    /// Pending deliveries of a subscription end as `abandoned` (their claims with them).
    func abandonDeliveries(_ tx: Transaction, webhookID: String, now: Timestamp, reason: String) throws
    /// A pending delivery's subscription and history (JSON text), held; nil when it is not pending.
    func lockedPendingDelivery(_ tx: Transaction, sequence: Int64) throws -> (webhookID: String, history: String)?
    /// Writes an attempt's outcome (`StoreRules.attemptRecorded`), and ends this node's claim where
    /// deliveries are claimed.
    func writeDeliveryAttempt(
        _ tx: Transaction, sequence: Int64, state: DeliveryRecord.State, next: Timestamp?, status: Int?, error: String?,
        history: String, now: Timestamp) throws
    func disableWebhook(_ tx: Transaction, id: String, reason: String) throws
    /// A subscription's deliveries in order after the sequence `after`, of one state or all, at
    /// most `limit`.
    func deliveryRows(_ tx: Transaction, webhookID: String, state: DeliveryRecord.State?, after: Int64, limit: Int) throws
        -> [DeliveryRecord]
}

/// Sessions changed by clients, written once over the driver.
extension SessionDriver {
    /// PATCH: `change` gets the stored session and returns the new configuration and/or enabled
    /// flag, inside the write transaction, so two concurrent PATCHes cannot lose each other's
    /// members. A configuration that an unfinished task's own overrides cannot be applied over is
    /// refused naming the tasks (StoreError.invalid): a task never silently loses a restriction.
    /// Disabling holds the session's tasks (`waiting`, `session_disabled`), or cancels them with
    /// reason 1 when `cancelPending`.
    public func updateSession(
        id: String, cancelPending: Bool,
        _ change: @escaping @Sendable (SessionRecord) throws -> (configuration: TransferConfiguration?, enabled: Bool?)
    ) throws(StoreError) -> (SessionRecord, [TaskState: Int]) {
        let now = self.now
        return try write { [self] tx in
            guard let stored = try lockedSessionRecord(tx, id: id) else { throw StoreError.notFound }
            let (session, input) = try StoreRules.sessionUpdate(stored, cancelPending: cancelPending, change) { configuration in
                try StoreRules.checkOverrides(try unfinishedOverrides(tx, sessionID: id), against: configuration)
            }
            try saveSession(tx, session)
            if let input {
                for task in try unfinishedTasks(tx, sessionID: id) {
                    if case .success(let next) = task.applying(input, now: now) { try save(tx, from: task, to: next, now: now) }
                }
            }
            guard let updated = try sessionRecord(tx, id: id) else { return (session, [:]) }
            return (updated, try counts(tx, sessionID: id))
        }
    }

    /// DELETE ?mode=finish: refuse new tasks, let the rest finish, remove the record when empty.
    /// DELETE ?mode=cancel: cancel every unfinished task (reason 0) and remove the record now.
    /// Returns true when the record is already gone.
    public func deleteSession(id: String, cancel: Bool) throws(StoreError) -> Bool {
        let now = self.now
        return try write { [self] tx in
            guard var session = try lockedSessionRecord(tx, id: id) else { throw StoreError.notFound }
            session.lifecycle = .finishing
            try saveSession(tx, session)
            let unfinished = try unfinishedTasks(tx, sessionID: id)
            if cancel {
                for task in unfinished {
                    try transition(tx, task, .serviceCancelled(.userCancelled, "cancelled: the session was deleted"), now: now)
                }
            }
            // The last task's end may already have removed it (a finishing session goes when empty).
            guard try sessionRecord(tx, id: id) != nil else { return true }
            if cancel || unfinished.isEmpty {
                try removeSession(tx, id: id)
                return true
            }
            return false
        }
    }
}

/// Webhook subscriptions and the bookkeeping of their deliveries, written once over the driver
/// (which deliveries a node sends, and its claims on them, stay in the driver).
extension SessionDriver {
    public func createWebhook(_ webhook: WebhookRecord) throws(StoreError) {
        try write { [self] tx in
            guard try sessionRecord(tx, id: webhook.sessionID) != nil else { throw StoreError.notFound }
            try saveWebhook(tx, webhook)
        }
    }

    /// Applies `change` to a subscription; re-enabling clears the reason it was disabled, and
    /// disabling abandons its pending deliveries.
    public func updateWebhook(id: String, _ change: @escaping @Sendable (inout WebhookRecord) throws -> Void) throws
        -> WebhookRecord
    {
        let now = self.now
        return try write { [self] tx in
            guard var webhook = try lockedWebhook(tx, id: id) else { throw StoreError.notFound }
            let wasEnabled = webhook.enabled
            try change(&webhook)
            if webhook.enabled { webhook.disabledReason = nil }
            if wasEnabled, !webhook.enabled {
                webhook.disabledReason = webhook.disabledReason ?? "disabled by a client"
                try abandonDeliveries(tx, webhookID: id, now: now, reason: "the subscription was disabled")
            }
            try saveWebhook(tx, webhook)
            return webhook
        }
    }

    /// Removes a subscription; its pending deliveries are abandoned (their history stays listed
    /// until pruned).
    public func deleteWebhook(id: String) throws(StoreError) {
        let now = self.now
        try write { [self] tx in
            guard try lockedWebhook(tx, id: id) != nil else { throw StoreError.notFound }
            try abandonDeliveries(tx, webhookID: id, now: now, reason: "the subscription was deleted")
            try deleteWebhookRow(tx, id: id)
        }
    }

    /// A subscription's deliveries in order, after `cursor`, optionally of one state.
    public func deliveries(webhookID: String, state: DeliveryRecord.State?, cursor: String?, limit: Int) throws(StoreError)
        -> (deliveries: [DeliveryRecord], nextCursor: String?)
    {
        let after = cursor.flatMap { Int64($0) } ?? 0
        return try read { tx in
            StoreRules.page(
                try deliveryRows(tx, webhookID: webhookID, state: state, after: after, limit: limit + 1), limit: limit)
        }
    }

    /// Writes one attempt's result. `gone` disables the subscription and abandons the rest.
    public func recordDeliveryAttempt(
        sequence: Int64, status: Int?, error: String?, decision: DeliveryPlan.Decision,
        done: @escaping @Sendable (StoreError?) -> Void
    ) {
        let now = self.now
        submit(
            { [self] tx in
                guard let (webhookID, historyText) = try lockedPendingDelivery(tx, sequence: sequence) else { return }
                let (state, next, history) = StoreRules.attemptRecorded(
                    history: historyText, now: now, status: status, error: error, decision: decision)
                try writeDeliveryAttempt(
                    tx, sequence: sequence, state: state, next: next, status: status, error: error, history: history, now: now)
                if decision == .gone {
                    let reason = "the receiver answered 410 Gone"
                    try disableWebhook(tx, id: webhookID, reason: reason)
                    try abandonDeliveries(tx, webhookID: webhookID, now: now, reason: reason)
                }
            },
            done: { result in
                if case .failure(let error) = result { done(error) } else { done(nil) }
            })
    }
}
