import BackhaulCore
import Glibc
import JSONCodec

/// A salvage of a damaged state database: when it ran, where the damaged files went, why, and what
/// was copied and lost. Written as `salvage.json` beside the damaged files, so that a later start
/// still shows the last one.
public struct SalvageReport: Sendable, Equatable {
    /// When the salvage ran.
    public var at: Timestamp
    /// The directory the damaged files were moved into (`<state dir>/corrupt-<UTC time>`).
    public var directory: String
    /// What was found damaged, in SQLite's words where it said.
    public var reason: String
    /// Rows copied into the fresh database (derived tables, recomputed, not counted).
    public var rowsCopied: Int
    /// Rows known to be lost, or nil when some damaged part could not be counted (a WAL whose
    /// header is damaged; a damaged range of a table no intact index covers).
    public var rowsLost: Int?
    /// Per table: rows copied and rows lost (nil: not known).
    public var tables: [TableFigures]
    /// Whether this start made it (false: an earlier start did, and left its report).
    public var isNew = true

    public struct TableFigures: Sendable, Equatable {
        public var name: String
        public var copied: Int
        public var lost: Int?

        package init(name: String, copied: Int, lost: Int?) {
            self.name = name
            self.copied = copied
            self.lost = lost
        }
    }

    /// The report as `salvage.json` holds it.
    public var json: JSON {
        var object = JSONObject()
        object["salvaged_at"] = .string(RFC3339.format(at))
        object["salvaged_from"] = .string(directory)
        object["reason"] = .string(reason)
        object["rows_copied"] = .int(Int64(rowsCopied))
        object["rows_lost"] = rowsLost.map { .int(Int64($0)) } ?? .null
        var figures = JSONObject()
        for table in tables {
            figures[table.name] = ["copied": .int(Int64(table.copied)), "lost": table.lost.map { .int(Int64($0)) } ?? .null]
        }
        object["tables"] = .object(figures)
        return .object(object)
    }

    /// Reads a report back from `salvage.json`'s text; nil when it is not one.
    package init?(json text: String, directory: String) {
        guard let value = try? JSON.parse(text), let at = value["salvaged_at"]?.stringValue.flatMap(RFC3339.parse) else {
            return nil
        }
        self.at = at
        self.directory = directory
        isNew = false
        reason = value["reason"]?.stringValue ?? ""
        rowsCopied = Int(value["rows_copied"]?.intValue ?? 0)
        rowsLost = value["rows_lost"]?.intValue.map { Int($0) }
        tables = (value["tables"]?.objectValue ?? [:]).map { name, figures in
            TableFigures(
                name: name, copied: Int(figures["copied"]?.intValue ?? 0), lost: figures["lost"]?.intValue.map { Int($0) })
        }
    }

    package init(at: Timestamp, directory: String, reason: String, tables: [TableFigures]) {
        self.at = at
        self.directory = directory
        self.reason = reason
        self.tables = tables
        rowsCopied = tables.reduce(0) { $0 + $1.copied }
        rowsLost = tables.reduce(0 as Int?) { sum, table in sum.flatMap { sum in table.lost.map { sum + $0 } } }
    }
}

/// A salvage that could not finish (a full disk, an error): what it built is removed, the damaged
/// files are where they were, and the next start tries again (the daemon exits 75).
public struct SalvageFailure: Error, Sendable, CustomStringConvertible {
    /// What was found damaged.
    public var damage: String
    /// Why the salvage stopped.
    public var cause: String

    public var description: String { "\(cause) (the damage: \(damage))" }

    package init(damage: String, cause: String) {
        self.damage = damage
        self.cause = cause
    }
}
