import JSON

/// Human output: aligned tables, sizes, rates.
public enum Format {
    public static func table(_ header: [String], _ rows: [[String]]) -> String {
        var widths = header.map(\.count)
        for row in rows { for (index, cell) in row.enumerated() where index < widths.count { widths[index] = max(widths[index], cell.count) } }
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { index, cell in
                index == cells.count - 1 ? cell : cell + String(repeating: " ", count: widths[index] - cell.count)
            }.joined(separator: "  ")
        }
        return ([line(header)] + rows.map(line)).joined(separator: "\n")
    }

    public static func bytes(_ count: Int64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB"]
        var value = Double(count)
        var unit = 0
        while value >= 1024, unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        return unit == 0 ? "\(count) B" : "\(String(format1: value)) \(units[unit])"
    }

    public static func rate(_ bytesPerSecond: Int64) -> String { bytesPerSecond > 0 ? bytes(bytesPerSecond) + "/s" : "-" }

    public static func duration(_ seconds: Double?) -> String {
        guard let seconds, seconds.isFinite, seconds >= 0 else { return "-" }
        let whole = Int(seconds.rounded())
        if whole < 60 { return "\(whole)s" }
        if whole < 3600 { return "\(whole / 60)m\(whole % 60)s" }
        return "\(whole / 3600)h\((whole % 3600) / 60)m"
    }

    /// A progress bar of `width` cells for a fraction in 0...1.
    public static func bar(_ fraction: Double, width: Int = 20) -> String {
        let filled = Int((max(0, min(1, fraction)) * Double(width)).rounded(.down))
        return "[" + String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled) + "]"
    }

    /// One line of a task for tables.
    /// The local file of a task: what an upload reads, or where a download goes.
    public static func localPath(_ task: JSON) -> String {
        task["file"]?["path"]?.stringValue ?? task["download"]?["destination"]?.stringValue ?? "?"
    }

    /// Bytes moved either way (a task counts only one of them).
    public static func moved(_ progress: JSON?) -> Int64 {
        (progress?["bytes_sent"]?.intValue ?? 0) + (progress?["bytes_received"]?.intValue ?? 0)
    }

    public static func taskRow(_ task: JSON) -> [String] {
        let progress = task["progress"]
        let state = task["state"]?.stringValue ?? "?"
        let reason = task["waiting_reason"]?.stringValue.map { " (\($0))" } ?? ""
        let error = task["error"]?["name"]?.stringValue.map { " \($0)" } ?? ""
        let fraction = progress?["fraction"]?.doubleValue ?? 0
        return [task["id"]?.stringValue ?? "?", state + reason + error, "\(Int((fraction * 100).rounded(.down)))%",
                bytes(progress?["bytes_total"]?.intValue ?? 0), task["request"]?["url"]?.stringValue ?? ""]
    }
}

extension String {
    /// One decimal place.
    init(format1 value: Double) {
        let tenths = Int((value * 10).rounded())
        self = "\(tenths / 10).\(tenths % 10)"
    }
}
