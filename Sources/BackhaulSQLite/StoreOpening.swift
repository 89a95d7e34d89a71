import BackhaulCore
import BackhaulQueue
import Glibc
import SQLite

/// Bringing a state directory written by any earlier release up to this build's schema.
enum StoreOpening {
    /// Applies the migrations this database lacks, in order, each in one transaction (or outside
    /// one, for those SQLite runs only there, such as `VACUUM`). Before the first, a copy of the
    /// database as it was is written beside it (`backhaul.db.v5.backup`) and kept until every
    /// migration committed: if one fails, the old state is there to go back to. A database newer
    /// than this build is refused, untouched.
    static func migrate(_ db: Connection, path: String) throws {
        let migrator = Migrator(migrations: Schema.migrations)
        let current = try migrator.version(db)
        guard current <= migrator.latest else {
            throw StoreError.newerSchema(found: current, supported: migrator.latest)
        }
        guard current < migrator.latest else { return }
        var backup: String?
        if current > 0 {
            let copy = "\(path).v\(current).backup"
            unlink(copy)
            try db.execute("VACUUM INTO '\(copy.replacing("'", with: "''"))'")
            backup = copy
        }
        try migrator.migrate(db)
        if let backup { unlink(backup) }
    }
}
