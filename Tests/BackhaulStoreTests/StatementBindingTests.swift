import SQLite
import Testing

/// Arguments reach SQLite as the values they are: each kind, '' as text rather than NULL, and text
/// past the statement's argument memory (which spills to blocks of its own for that round).
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
}
