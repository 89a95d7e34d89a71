import BackhaulQueue
import SQLite

/// An INSERT of many rows a statement. A statement's own cost (an autoincrement counter read and
/// written back, its journal opened and closed, its run set up and halted) was a third of
/// inserting a task and its event one row at a time, in a batch of 1,000 measured alone; in rows
/// of 32 it is paid once for them all. Statements of 32, 8 and 1 rows only, so that three are
/// prepared and kept whatever the number of rows.
struct RowInsert {
    static let rowsPerStatement = [32, 8, 1]
    let columnCount: Int
    private let statements: [Int: String]

    /// `head` is the statement up to its VALUES: `INSERT INTO t (a, b)`.
    init(_ head: String, columns: Int) {
        columnCount = columns
        let row = "(" + Array(repeating: "?", count: columns).joined(separator: ", ") + ")"
        statements = Dictionary(
            uniqueKeysWithValues: Self.rowsPerStatement.map { rows in
                (rows, "\(head) VALUES \(Array(repeating: row, count: rows).joined(separator: ", "))")
            })
    }

    /// Inserts a row for each item, in order; `values` appends an item's `columnCount` values.
    func run<Items: Collection>(
        _ db: Connection, _ items: Items, values: (Items.Element, inout [any SQLBindable]) -> Void
    ) throws {
        var rest = items[...]
        var arguments: [any SQLBindable] = []
        while !rest.isEmpty {
            let rows = Self.rowsPerStatement.first { $0 <= rest.count }!
            arguments.removeAll(keepingCapacity: true)
            arguments.reserveCapacity(rows * columnCount)
            for item in rest.prefix(rows) { values(item, &arguments) }
            precondition(arguments.count == rows * columnCount, "each row has every column")
            try db.run(statements[rows]!, arguments)
            rest = rest.dropFirst(rows)
        }
    }
}
