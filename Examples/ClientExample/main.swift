// Hands one file to backhauld and waits for the upload to end, by the event stream.
// Usage: backhaul-client-example FILE URL (the daemon at BACKHAUL_URL, or 127.0.0.1:8427).
import BackhaulClient
import Foundation

/// Uploads `file` to `url` through the daemon; the task as it ended.
func upload(_ file: String, to url: String, with client: BackhaulClient) async throws(APIError) -> APITask {
    // A session holds the tasks of one client; creating it again is fine.
    try await client.ensureSession("example")

    // Follow the session's events from now on: the stream is open before the task exists, so
    // its end cannot be missed.
    var events = client.events(session: "example").makeAsyncIterator()

    let created = try await client.createTasks(
        [.upload(file: file, url: url, protocol: "chunked", chunkSize: 1 << 20)], session: "example")
    var task = created[0]
    print("enqueued \(task.id)")

    // A task event carries the task as it was then.
    while !task.state.isFinal, let event = try await events.next() {
        if let changed = event.task, changed.id == task.id { task = changed }
    }
    // A stream that ended early (the daemon stopped) leaves the state to be asked.
    return task.state.isFinal ? task : try await client.task(task.id)
}

let arguments = CommandLine.arguments
guard arguments.count == 3 else {
    print("usage: backhaul-client-example FILE URL")
    exit(64)
}
let client = BackhaulClient(url: ProcessInfo.processInfo.environment["BACKHAUL_URL"] ?? "http://127.0.0.1:8427")
do {
    let task = try await upload(arguments[1], to: arguments[2], with: client)
    print("\(task.id) \(task.state.rawValue): \(task.progress.bytesSent) bytes sent")
    exit(task.state == .completed ? 0 : 3)
} catch {
    // A refusal carries the API's stable code (`file_not_found`, `validation_failed`, …).
    print("backhaul-client-example: \(error)")
    exit(error.code == nil ? 4 : 1)
}
