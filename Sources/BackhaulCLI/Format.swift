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
        // An unfinished task whose latest attempt failed says so, and why, before it ends.
        let finished = ["completed", "failed", "cancelled"].contains(state)
        let failing = finished ? "" : task["last_error"].flatMap(errorSummary).map { " ! \($0)" } ?? ""
        let fraction = progress?["fraction"]?.doubleValue ?? 0
        return [task["id"]?.stringValue ?? "?", state + reason + error + failing, "\(Int((fraction * 100).rounded(.down)))%",
                bytes(progress?["bytes_total"]?.intValue ?? 0), task["request"]?["url"]?.stringValue ?? ""]
    }
}

extension Format {
    /// `name (HTTP 503)` of an error object; nil for null.
    public static func errorSummary(_ error: JSON) -> String? {
        guard let name = error["name"]?.stringValue else { return nil }
        return name + (error["http_status"]?.intValue.map { " (HTTP \($0))" } ?? "")
    }

    /// An error object in one line: `-1011 bad_server_response (HTTP 503): the server answered 503`.
    public static func errorLine(_ error: JSON) -> String {
        "\(error["code"]?.intValue ?? 0) \(errorSummary(error) ?? ""): \(error["message"]?.stringValue ?? "")"
    }

    /// The attempt history of `GET /v1/tasks/{id}/attempts`, newest first, as a table.
    public static func attempts(_ attempts: [JSON]) -> String {
        table(["#", "STARTED", "TOOK", "MOVED", "OUTCOME", "ERROR"], attempts.map { attempt in
            let started = attempt["started_at"]?.stringValue ?? ""
            let took = zip(attempt["started_at"]?.stringValue.flatMap(RFC3339Text.seconds), attempt["ended_at"]?.stringValue.flatMap(RFC3339Text.seconds))
                .map { duration($1 - $0) } ?? "-"
            let moved = (attempt["bytes_sent"]?.intValue ?? 0) + (attempt["bytes_received"]?.intValue ?? 0)
            return [String(attempt["number"]?.intValue ?? 0), String(started.prefix(19)).replacing("T", with: " "), took, bytes(moved),
                    attempt["outcome"]?.stringValue ?? "", attempt["error"].flatMap(errorSummary) ?? "-"]
        })
    }
}

/// Optional pairs: both or nothing.
private func zip<A, B>(_ a: A?, _ b: B?) -> (A, B)? {
    guard let a, let b else { return nil }
    return (a, b)
}

/// Enough of RFC 3339 for durations between two of the API's timestamps (UTC, `…Z`).
enum RFC3339Text {
    static func seconds(_ text: String) -> Double? {
        let parts = text.split(separator: "T")
        guard parts.count == 2 else { return nil }
        let date = parts[0].split(separator: "-").compactMap { Int($0) }
        let time = parts[1].dropLast().split(separator: ":")
        guard date.count == 3, time.count == 3, let hours = Double(time[0]), let minutes = Double(time[1]),
            let seconds = Double(time[2]) else { return nil }
        // Days since the epoch (civil calendar), then the time of day.
        let (y, m, d) = (date[1] <= 2 ? date[0] - 1 : date[0], date[1], date[2])
        let era = y / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        let days = Double(era * 146_097 + dayOfEra - 719_468)
        return days * 86_400 + hours * 3600 + minutes * 60 + seconds
    }
}

extension String {
    /// One decimal place.
    init(format1 value: Double) {
        let tenths = Int((value * 10).rounded())
        self = "\(tenths / 10).\(tenths % 10)"
    }
}
