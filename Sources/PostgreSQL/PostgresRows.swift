internal import CLibPQ

/// The rows a statement returned (a `PGresult` in text format), freed with the value. Columns are
/// read by position; a NULL reads as nil.
public final class PostgresRows {
    private let result: OpaquePointer

    init(_ result: OpaquePointer) { self.result = result }
    deinit { PQclear(result) }

    public var count: Int { Int(PQntuples(result)) }
    public var columnCount: Int { Int(PQnfields(result)) }
    /// How many rows an INSERT, UPDATE or DELETE touched (`PQcmdTuples`); 0 for other statements.
    public var affected: Int { Int(String(cString: PQcmdTuples(result))) ?? 0 }

    public func isNull(_ row: Int, _ column: Int) -> Bool {
        !inRange(row, column) || PQgetisnull(result, Int32(row), Int32(column)) == 1
    }

    /// The column's text, nil for NULL.
    public func string(_ row: Int, _ column: Int) -> String? {
        guard !isNull(row, column), let value = PQgetvalue(result, Int32(row), Int32(column)) else { return nil }
        return String(cString: value)
    }

    public func int(_ row: Int, _ column: Int) -> Int64? { string(row, column).flatMap { Int64($0) } }
    public func double(_ row: Int, _ column: Int) -> Double? { string(row, column).flatMap { Double($0) } }
    public func bool(_ row: Int, _ column: Int) -> Bool? { string(row, column).map { $0 == "t" } }

    /// A `bytea` column, which the text format writes as `\x` and two hex digits a byte.
    public func bytes(_ row: Int, _ column: Int) -> [UInt8]? {
        guard let text = string(row, column) else { return nil }
        let digits = Array(text.utf8.dropFirst(2))
        guard text.hasPrefix("\\x"), digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = Self.hexValue(digits[index]), let low = Self.hexValue(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
    }

    private func inRange(_ row: Int, _ column: Int) -> Bool {
        row >= 0 && row < count && column >= 0 && column < columnCount
    }

    private static func hexValue(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
