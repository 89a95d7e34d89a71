import BackhaulCore
import BackhaulQueue
import Glibc
import JSONCodec
import SQLite

/// The salvage's copy of rows: table by table in key order, past the damaged ranges, counting
/// what could not be read.
extension StoreSalvage {
    /// A table to copy: its columns in the fresh database, and the key it is read in order of.
    struct Table {
        var name: String
        var columns: [String]
        /// `rowid`, or a WITHOUT ROWID table's primary key columns (its first is an integer the
        /// damaged ranges are skipped by).
        var key: [String]
        var hasRowID: Bool { key == ["rowid"] }
    }

    /// The fresh database's tables that hold rows of their own: not SQLite's, not the counts
    /// computed from `tasks`.
    static func copiedTables(_ fresh: Connection) throws -> [Table] {
        let names = try fresh.query(
            "SELECT name, sql FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name != 'session_counts' ORDER BY rootpage"
        ) { ($0.string(0), $0.string(1)) }
        return try names.map { name, sql in
            let columns = try fresh.query("SELECT name, pk FROM pragma_table_info(?) ORDER BY cid", [name]) {
                ($0.string(0), Int($0.int(1)))
            }
            let key =
                sql.uppercased().contains("WITHOUT ROWID")
                ? columns.filter { $0.1 > 0 }.sorted { $0.1 < $1.1 }.map(\.0) : ["rowid"]
            return Table(name: name, columns: columns.map(\.0), key: key)
        }
    }

    /// Copies `table` in key order, skipping what cannot be read. The figures: rows copied, and
    /// rows lost (nil when a skipped range could not be counted). Every read seeks to a key it
    /// includes (`>=`): a seek to a key that a damaged page holds fails, and one past it does not.
    static func copy(_ table: Table, from damaged: Connection, to fresh: Connection) throws -> SalvageReport.TableFigures {
        let quoted = table.columns.map { "\"\($0)\"" }
        let first = table.key[0]
        let order = table.key.joined(separator: ", ")
        let select =
            "SELECT \(first), \(quoted.joined(separator: ", ")) FROM \"\(table.name)\" WHERE \(first) >= ? ORDER BY \(order)"
        let insert =
            "INSERT INTO \"\(table.name)\" (\(quoted.joined(separator: ", "))) VALUES (\(quoted.map { _ in "?" }.joined(separator: ", ")))"
        let stateColumn = table.name == "tasks" ? table.columns.firstIndex(of: "state").map { Int32($0) + 1 } : nil
        var copied = 0
        var lost: Int? = 0
        // Every key of this schema is positive (AUTOINCREMENT sequences and implicit rowids start at 1).
        var next: Int64 = 0
        while true {
            let start = next
            do {
                _ = try damaged.query(select, [next]) { row in
                    let key = row.int(0)
                    next = key == Int64.max ? key : key + (table.hasRowID ? 1 : 0)
                    if let stateColumn, TaskState(rawValue: row.string(stateColumn)) == nil {
                        lost = lost.map { $0 + 1 }
                        return
                    }
                    do {
                        try fresh.run(insert, (1..<row.columnCount).map { row.value($0) })
                        copied += 1
                    } catch let error as SQLiteError where error.isConstraintViolation {
                        lost = lost.map { $0 + 1 }
                    }
                }
                break
            } catch let error as SQLiteError where error.isDamage {
                // A WITHOUT ROWID table's scan stopped inside the rows sharing its first key
                // column: the rest of them count as lost (not counted: such a table has no index).
                if !table.hasRowID { next = max(next, start) + 1 }
                let resume = nextReadable(table, from: next, in: damaged)
                let skipped = countRows(table, after: next - 1, through: resume.map { $0 - 1 }, in: damaged)
                lost = lost.flatMap { lost in skipped.map { lost + $0 } }
                guard let resume else { break }
                // Always past where this pass began, so the loop ends.
                next = max(resume, start + 1)
            } catch let error as SQLiteError where error.message.hasPrefix("no such table") {
                // The damaged file's schema, readable, lacks a table its version has: what it held is not known.
                lost = nil
                break
            }
        }
        return SalvageReport.TableFigures(name: table.name, copied: copied, lost: lost)
    }

    /// The lowest key `k` from `from` on such that the rows from `k` on can be read again from a
    /// seek, found by doubling the step past `from` until a seek succeeds, then halving back; nil
    /// when none does (the rest of the table is lost). A seek to a key inside a damaged page
    /// fails; one to the key just past it lands on the next page and reads its first row.
    static func nextReadable(_ table: Table, from: Int64, in damaged: Connection) -> Int64? {
        let quoted = table.columns.map { "\"\($0)\"" }.joined(separator: ", ")
        let first = table.key[0]
        let probe =
            "SELECT \(quoted) FROM \"\(table.name)\" WHERE \(first) >= ? ORDER BY \(table.key.joined(separator: ", ")) LIMIT 1"
        func readable(_ key: Int64) -> Bool { (try? damaged.query(probe, [key]) { _ in () }) != nil }
        guard !readable(from) else { return from }
        var failed = from
        var step: Int64 = 1
        var good: Int64?
        while good == nil {
            let (key, overflow) = from.addingReportingOverflow(step)
            if overflow { return nil }
            if readable(key) { good = key } else { failed = key }
            guard step <= Int64.max / 2 else { break }
            step *= 2
        }
        guard var good else { return nil }
        while good - failed > 1 {
            let middle = failed + (good - failed) / 2
            if readable(middle) { good = middle } else { failed = middle }
        }
        return good
    }

    /// Rows of `table` with keys in (after, through] (through nil: no upper end), counted through
    /// any full index of it that can still be read; nil when none can (or the table has no rowid).
    static func countRows(_ table: Table, after: Int64, through: Int64?, in damaged: Connection) -> Int? {
        guard table.hasRowID,
            let indexes = try? damaged.query(
                "SELECT name FROM pragma_index_list(?) WHERE partial = 0", [table.name], { $0.string(0) })
        else { return nil }
        for index in indexes {
            let bound = through == nil ? "" : " AND rowid <= ?"
            let arguments: [any SQLBindable] = through.map { [after, $0] } ?? [after]
            if let count = try? damaged.queryFirst(
                "SELECT count(*) FROM \"\(table.name)\" INDEXED BY \"\(index)\" WHERE rowid > ?\(bound)", arguments,
                { Int($0.int(0)) })
            {
                return count
            }
        }
        return nil
    }

    /// Tasks lost: the damaged file's counts per session and state say how many there were, when
    /// they can be read; the copy's own count where they cannot.
    static func tasksLost(_ figures: SalvageReport.TableFigures, damaged: Connection) -> Int? {
        guard let total = try? damaged.queryFirst("SELECT coalesce(sum(count), 0) FROM session_counts", [], { Int($0.int(0)) })
        else { return figures.lost }
        return max(figures.lost ?? 0, total - figures.copied)
    }

    /// Raises each AUTOINCREMENT table's high-water mark to the damaged file's where that is higher.
    static func keepSequences(from damaged: Connection, in fresh: Connection) throws {
        guard let marks = try? damaged.query("SELECT name, seq FROM sqlite_sequence", [], { ($0.string(0), $0.int(1)) })
        else { return }
        for (name, seq) in marks {
            guard
                try fresh.queryFirst("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?", [name], { _ in true })
                    != nil
            else { continue }
            if try fresh.run("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", [seq, name]) == 0 {
                try fresh.run("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", [name, seq])
            }
        }
    }
}
