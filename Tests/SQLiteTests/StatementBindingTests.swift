import SQLite
import Testing

/// Arguments reach SQLite as the values they are: each kind, '' as text rather than NULL, an empty
/// blob as a blob, text past the statement's argument memory (which spills to blocks of its own
/// for that round), and a statement bound again after a round that failed.
@Suite("Statement arguments")
struct StatementBindingTests {
    let db: Connection

    init() throws { db = try Connection(path: ":memory:") }

    @Test func eachKindKeepsItsType() throws {
        let empty: String? = ""
        let none: Int? = nil
        let row = try db.queryFirst(
            "SELECT typeof(?1), ?1, typeof(?2), typeof(?3), ?3, typeof(?4), ?4, typeof(?5), ?5, typeof(?6), typeof(?7), hex(?7)",
            ["", empty, Int64(-7), 2.5, true, none, SQLValue.blob([0, 255])]
        ) { row in
            [
                row.string(0), row.string(1), row.string(2), row.string(3), row.string(4), row.string(5),
                row.string(6), row.string(7), row.string(8), row.string(9), row.string(10), row.string(11),
            ]
        }
        #expect(row == ["text", "", "text", "integer", "-7", "real", "2.5", "integer", "1", "null", "blob", "00FF"])
    }

    @Test func textPastTheArgumentMemoryStaysIntact() throws {
        let texts = (0..<6).map { index in String(repeating: Character(String(index)), count: 700 + index) }
        let sql = "SELECT " + (1...6).map { "?\($0)" }.joined(separator: ", ")
        for _ in 0..<3 {
            let values = try db.queryFirst(sql, texts) { row in (0..<6).map { row.string(Int32($0)) } }
            #expect(values == texts)
        }
        // A short round after the long ones: nothing of them is left over.
        #expect(try db.queryFirst("SELECT ?1 || ?2", ["a", ""]) { $0.string(0) } == "a")
    }

    @Test func emptyBlobIsABlob() throws {
        let row = try db.queryFirst("SELECT typeof(?1), length(?1)", [SQLValue.blob([])]) { [$0.string(0), $0.string(1)] }
        #expect(row == ["blob", "0"])
    }

    @Test func writtenTextReadsBack() throws {
        try db.execute("CREATE TABLE t (a TEXT, b TEXT)")
        let long = String(repeating: "é", count: 2_000)
        try db.transaction {
            try db.run("INSERT INTO t (a, b) VALUES (?, ?)", ["short", long])
            try db.run("INSERT INTO t (a, b) VALUES (?, ?)", ["", "x"])
        }
        let rows = try db.query("SELECT a, b FROM t ORDER BY rowid", []) { [$0.string(0), $0.string(1)] }
        #expect(rows == [["short", long], ["", "x"]])
    }

    @Test func aFailedRoundLeavesTheStatementUsable() throws {
        let sql = "SELECT ?1 || ?2"
        #expect(throws: SQLiteError.self) { try db.queryFirst(sql, ["a", "b", "one too many"]) { $0.string(0) } }
        #expect(try db.queryFirst(sql, ["a", "b"]) { $0.string(0) } == "ab")
    }

    /// SQLite's memory statistics are off (each allocation took a global mutex to count): nothing
    /// is counted once a connection has opened and run statements.
    @Test func memoryIsNotCounted() throws {
        try db.execute("CREATE TABLE m (v TEXT); INSERT INTO m VALUES ('x')")
        #expect(Connection.memoryCounted == 0)
    }
}
