import BackhaulCore
import JSONCodec
import SQLite

/// What the policy layer keeps: run-time settings (network override, service policy), the
/// discretionary byte budgets, and the moves of tasks between `queued` and `waiting`.
extension Store {
    public func setting(_ key: String) throws(StoreError) -> JSON? {
        try read { db in
            try db.queryFirst("SELECT value FROM settings WHERE key = ?", [key]) { row in try JSON.parse(row.string(0), maxDepth: 64) }
        }
    }

    /// Stores a setting, or removes it when `value` is nil.
    public func setSetting(_ key: String, _ value: JSON?) throws(StoreError) {
        try write { db in
            if let value {
                try db.run("INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                           [key, value.serialized()])
            } else {
                try db.run("DELETE FROM settings WHERE key = ?", [key])
            }
        }
    }

    /// Adds bytes sent by discretionary tasks to a day's budget use; days before are forgotten.
    public func addBudgetUsage(day: String, _ bytes: [NetworkType: Int64]) throws(StoreError) {
        try write(.relaxed) { db in
            for (type, count) in bytes where count > 0 {
                try db.run("""
                    INSERT INTO budget_usage (day, network_type, bytes) VALUES (?, ?, ?)
                    ON CONFLICT (day, network_type) DO UPDATE SET bytes = bytes + excluded.bytes
                    """, [day, type.rawValue, count])
            }
            try db.run("DELETE FROM budget_usage WHERE day < ?", [day])
        }
    }

    public func budgetUsage(day: String) throws(StoreError) -> [NetworkType: Int64] {
        try read { db in
            var result: [NetworkType: Int64] = [:]
            for (name, bytes) in try db.query("SELECT network_type, bytes FROM budget_usage WHERE day = ?", [day], {
                ($0.string(0), $0.int(1))
            }) {
                if let type = NetworkType(rawValue: name) { result[type] = bytes }
            }
            return result
        }
    }

    /// Tasks the policy holds (`waiting` for one of `Policy.reasons`), in creation order after
    /// `afterSequence`, with their current reason.
    public func policyHeldTasks(afterSequence: Int64, limit: Int) throws(StoreError) -> [(QueueEntry, WaitingReason)] {
        let reasons = JSON.array(Policy.reasons.map { .string($0.rawValue) }.sorted { $0.stringValue! < $1.stringValue! }).serialized()
        return try read { db in
            try db.query("""
                SELECT \(Store.queueColumns), waiting_reason FROM tasks
                WHERE state = 'waiting' AND waiting_reason IN (SELECT value FROM json_each(?)) AND seq > ?
                ORDER BY seq LIMIT ?
                """, [reasons, afterSequence, limit]) { row in
                guard let reason = WaitingReason(rawValue: row.string(6)) else {
                    throw StoreError.corrupt("task \(row.string(1)) waits for the reason \(row.string(6))")
                }
                return (try Store.decodeQueueEntry(row), reason)
            }
        }
    }

    /// Applies the policy's decision to a task that is `queued` or held by the policy: run puts
    /// it (back) in the queue, wait holds it with the reason (a `task.waiting` event when the
    /// reason changes), fail ends it. Nil when the task is in neither place any more.
    @discardableResult
    public func applyPolicy(id: String, _ decision: PolicyDecision) throws(StoreError) -> TaskRecord? {
        let now = self.now
        return try write(.relaxed) { db in
            guard let task = try Store.fetchTask(db, id: id),
                task.state == .queued || task.state == .waiting && Policy.reasons.contains(task.waitingReason ?? .scheduled)
            else { return nil }
            return try Store.save(db, changing: task, now: now) { task in
                switch decision {
                case .run: Store.enter(.queued, task: &task, now: now)
                case .wait(let reason): Store.enter(.waiting, task: &task, now: now, waitingReason: reason)
                case .fail(let error):
                    Store.enter(.failed, task: &task, now: now)
                    task.error = error
                }
            }
        }
    }

    /// The service-wide switch: every unfinished task is cancelled with `reason`. Returns how many.
    public func cancelUnfinished(reason: CancellationReason) throws(StoreError) -> Int {
        let now = self.now
        return try write { db in
            let ids = try db.query("SELECT id FROM tasks WHERE state NOT IN ('completed', 'failed', 'cancelled')", []) { $0.string(0) }
            for id in ids {
                _ = try Store.mutate(db, id: id, now: now) { task in
                    Store.cancel(&task, reason: reason, now: now)
                }
            }
            return ids.count
        }
    }
}
