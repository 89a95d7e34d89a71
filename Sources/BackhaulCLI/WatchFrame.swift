import BackhaulClient

/// What `watch` prints each refresh (pure, so tests can check the rendering).
public enum WatchFrame {
    /// The task with its progress moved on by `seconds` at its last rate, up to its size: bars
    /// keep moving between progress events, and each event sets them right.
    public static func extrapolated(_ task: APITask, by seconds: Double) -> APITask {
        var progress = task.progress
        let rate = progress.bytesPerSecond
        guard rate > 0, seconds > 0 else { return task }
        var moved = (task.kind == .download ? progress.bytesReceived : progress.bytesSent) + Int64(Double(rate) * seconds)
        if let total = progress.bytesTotal, total > 0 {
            moved = min(moved, total)
            progress.fraction = Double(moved) / Double(total)
            progress.etaSeconds = Double(total - moved) / Double(rate)
        }
        if task.kind == .download { progress.bytesReceived = moved } else { progress.bytesSent = moved }
        var moving = task
        moving.progress = progress
        return moving
    }

    /// The order of the summary line.
    static let summaryOrder: [TaskState] = [
        .running, .queued, .waiting, .retrying, .suspended, .authRequired, .completed, .failed, .cancelled,
    ]

    /// One line per running task (id, file, bar, percentage, bytes, rate, ETA), then the counts.
    public static func render(running: [APITask], counts: [TaskState: Int]) -> String {
        var lines: [String] = running.map { task in
            let progress = task.progress
            return "\(task.id)  \(Format.fileName(task))  \(Format.bar(progress.fraction)) \(Format.percent(progress.fraction))  "
                + "\(Format.bytes(progress.moved))/\(Format.bytes(progress.bytesTotal ?? 0))  "
                + "\(Format.rate(progress.bytesPerSecond))  ETA \(Format.duration(progress.etaSeconds))"
                + (progress.background.map { "  " + Format.yielding($0) } ?? "")
        }
        lines.append(summaryOrder.map { "\(counts[$0] ?? 0) \($0.rawValue)" }.joined(separator: ", "))
        return lines.joined(separator: "\n")
    }
}
