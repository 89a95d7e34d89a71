import BackhaulCore
import BackhaulQueue
import JSONCodec
import PostgreSQL

/// What the policy layer keeps, as `Store+Policy` does for SQLite: run-time settings (network
/// override, service policy) and the discretionary byte budgets, shared by the fleet. A setting's
/// change reaches the other nodes' observers with the commit (`StoreChanges.settings`).
extension PostgresStore {
    public func setting(_ key: String) throws(StoreError) -> JSON? {
        try read { tx in
            try tx.first("SELECT value FROM settings WHERE key = $1", [.text(key)]) { row in
                try JSON.parse(row.string(0), maxDepth: 64)
            }
        }
    }

    /// Stores a setting, or removes it when `value` is nil.
    /// `staging` runs inside the transaction (again, should the transaction run again), in commit order.
    public func setSetting(_ key: String, _ value: JSON?, staging: @escaping () -> Void) throws(StoreError) {
        try write { tx in
            tx.changes.settings.insert(key)
            staging()
            if let value {
                try tx.execute(
                    "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    [.text(key), .text(value.serialized())])
            } else {
                try tx.execute("DELETE FROM settings WHERE key = $1", [.text(key)])
            }
        }
    }

    /// Adds bytes sent by discretionary tasks to a day's budget use (every node's add up); days
    /// before are forgotten.
    public func addBudgetUsage(day: String, _ bytes: [NetworkType: Int64]) {
        submit(
            { tx in
                for (type, count) in bytes.sorted(by: { $0.key.rawValue < $1.key.rawValue }) where count > 0 {
                    try tx.execute(
                        """
                        INSERT INTO budget_usage (day, network_type, bytes) VALUES ($1, $2, $3)
                        ON CONFLICT (day, network_type) DO UPDATE SET bytes = budget_usage.bytes + excluded.bytes
                        """, [.text(day), .text(type.rawValue), .int(count)])
                }
                try tx.execute("DELETE FROM budget_usage WHERE day < $1", [.text(day)])
            }, done: { _ in })
    }

    public func budgetUsage(day: String) throws(StoreError) -> [NetworkType: Int64] {
        try read { tx in
            var result: [NetworkType: Int64] = [:]
            for (name, bytes) in try tx.rows(
                "SELECT network_type, bytes FROM budget_usage WHERE day = $1", [.text(day)], { ($0.string(0), $0.int(1)) })
            {
                if let type = NetworkType(rawValue: name) { result[type] = bytes }
            }
            return result
        }
    }
}
