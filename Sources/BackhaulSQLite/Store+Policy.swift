import BackhaulCore
import BackhaulQueue
import JSONCodec
import SQLite

/// What the policy layer keeps: run-time settings (network override, service policy) and the
/// discretionary byte budgets.
extension Store {
    public func setting(_ key: String) throws(StoreError) -> JSON? {
        try read { db in
            try db.queryFirst("SELECT value FROM settings WHERE key = ?", [key]) { row in
                try JSON.parse(row.string(0), maxDepth: 64)
            }
        }
    }

    /// Stores a setting, or removes it when `value` is nil.
    /// `staging` runs inside the transaction (again, should the batch run again), in commit order.
    public func setSetting(_ key: String, _ value: JSON?, staging: @escaping () -> Void = {}) throws(StoreError) {
        try write { [self] db in
            recorder.update { $0.settings.insert(key) }
            staging()
            if let value {
                try db.run(
                    "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    [key, value.serialized()])
            } else {
                try db.run("DELETE FROM settings WHERE key = ?", [key])
            }
        }
    }

    /// Adds bytes sent by discretionary tasks to a day's budget use; days before are forgotten.
    public func addBudgetUsage(day: String, _ bytes: [NetworkType: Int64]) {
        submit(
            { db in
                for (type, count) in bytes where count > 0 {
                    try db.run(
                        """
                        INSERT INTO budget_usage (day, network_type, bytes) VALUES (?, ?, ?)
                        ON CONFLICT (day, network_type) DO UPDATE SET bytes = bytes + excluded.bytes
                        """, [day, type.rawValue, count])
                }
                try db.run("DELETE FROM budget_usage WHERE day < ?", [day])
            }, done: { _ in })
    }

    public func budgetUsage(day: String) throws(StoreError) -> [NetworkType: Int64] {
        try read { db in
            var result: [NetworkType: Int64] = [:]
            for (name, bytes) in try db.query(
                "SELECT network_type, bytes FROM budget_usage WHERE day = ?", [day],
                {
                    ($0.string(0), $0.int(1))
                })
            {
                if let type = NetworkType(rawValue: name) { result[type] = bytes }
            }
            return result
        }
    }
}
