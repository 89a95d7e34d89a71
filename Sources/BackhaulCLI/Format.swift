import BackhaulClient
import JSONCodec

import enum BackhaulCore.RFC3339

/// Human output shared by the commands: aligned tables, sizes, rates, durations, task rows and
/// error lines; and `--json` output.
public enum Format {
    public static func table(_ header: [String], _ rows: [[String]]) -> String {
        var widths = header.map(\.count)
        for row in rows {
            for (index, cell) in row.enumerated() where index < widths.count { widths[index] = max(widths[index], cell.count) }
        }
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { index, cell in
                index == cells.count - 1 ? cell : cell + String(repeating: " ", count: widths[index] - cell.count)
            }.joined(separator: "  ")
        }
        return ([line(header)] + rows.map(line)).joined(separator: "\n")
    }

    /// API objects as the API sent them, in an array.
    public static func json(_ objects: [JSON]) -> String { JSON.array(objects).serialized() }

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

    /// A fraction as a whole percentage, rounded down (`99%` until done).
    public static func percent(_ fraction: Double) -> String { "\(Int((fraction * 100).rounded(.down)))%" }
}

// MARK: Tasks

extension Format {
    /// Tasks as the table `upload`, `download`, `ls`, `cancel`, `suspend` and `resume` print.
    public static func tasks(_ tasks: [APITask]) -> String { table(["ID", "STATE", "DONE", "SIZE", "URL"], tasks.map(taskRow)) }

    /// One line of a task: its state with the waiting reason, the error's name, and for an
    /// unfinished task whose latest attempt failed, `! name` of that failure.
    public static func taskRow(_ task: APITask) -> [String] {
        let reason = task.waitingReason.map { " (\($0))" } ?? ""
        let error = task.error.map { " \($0.name)" } ?? ""
        // An unfinished task whose latest attempt failed says so, and why, before it ends.
        let failing = task.state.isFinal ? "" : task.lastError.map { " ! \(errorSummary($0))" } ?? ""
        let pacing = task.progress.background.map { " " + yielding($0) } ?? ""
        return [
            task.id, task.state.rawValue + reason + error + failing + pacing, percent(task.progress.fraction),
            bytes(task.progress.bytesTotal ?? 0), task.url,
        ]
    }

    /// A background transfer's pacing: `(background: 4.1 MB/s, queue 3 ms)`.
    public static func yielding(_ pacing: TaskProgress.BackgroundPacing) -> String {
        "(background: \(rate(pacing.rateBytesPerSecond)), queue \(Int(pacing.queueDelayMilliseconds.rounded())) ms)"
    }

    /// `name (HTTP 503)` of an error.
    public static func errorSummary(_ error: TaskFailure) -> String {
        error.name + (error.httpStatus.map { " (HTTP \($0))" } ?? "")
    }

    /// An error in one line: `-1011 bad_server_response (HTTP 503): the server answered 503`.
    public static func errorLine(_ error: TaskFailure) -> String {
        "\(error.code) \(errorSummary(error)): \(error.message ?? "")"
    }

    /// The attempt history of `GET /v1/tasks/{id}/attempts`, newest first, as a table.
    public static func attempts(_ attempts: [APIAttempt]) -> String {
        table(
            ["#", "STARTED", "TOOK", "MOVED", "OUTCOME", "ERROR"],
            attempts.map { attempt in
                let took = RFC3339.parse(attempt.startedAt).flatMap { started in
                    attempt.endedAt.flatMap(RFC3339.parse).map { duration($0 - started) }
                }
                return [
                    String(attempt.number), String(attempt.startedAt.prefix(19)).replacing("T", with: " "), took ?? "-",
                    bytes(attempt.bytesSent + attempt.bytesReceived), attempt.outcome,
                    attempt.error.map(errorSummary) ?? "-",
                ]
            })
    }

    /// The last component of a task's local file (`?` when it has none).
    public static func fileName(_ task: APITask) -> String {
        guard let path = task.localPath else { return "?" }
        return path.split(separator: "/").last.map(String.init) ?? path
    }
}

extension String {
    /// One decimal place.
    init(format1 value: Double) {
        let tenths = Int((value * 10).rounded())
        self = "\(tenths / 10).\(tenths % 10)"
    }
}
