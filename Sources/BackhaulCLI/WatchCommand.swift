import ArgumentParser
import BackhaulClient
import Glibc

import func BackhaulCore.monotonicSeconds

/// `watch`: live progress from the event stream, drawn by `WatchFrame`.
struct Watch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Live progress: one line per running task with rate and ETA, and a summary line.",
        discussion: """
            Progress comes from the daemon's event stream (GET /v1/events): a task.progress event \
            per running task every progress_interval (5 s unless the daemon is told otherwise), \
            and between events the bars move on at each task's last rate. The counts are asked \
            again only after a task changes state. With a client token, name one of its sessions.
            """)

    @OptionGroup var connection: Connection
    @Option(help: "Only this session.") var session: String?
    @Option(help: "Seconds between frames, at least.") var interval = 0.5
    @Flag(help: "Print one frame and exit.") var once = false
    @Flag(help: "Exit when no task is left unfinished.") var untilDone = false

    mutating func run() async throws {
        try await running {
            let client = connection.client()
            let watch = LiveTasks(client: client, session: session, interval: interval, untilDone: untilDone)
            try await watch.load()
            guard !once else {
                emit(WatchFrame.render(running: watch.runningTasks(at: monotonicSeconds()), counts: watch.counts))
                return
            }
            guard await watch.drawIfDue() else { return }
            var lastEventID: String?
            var lost: Double?
            // The stream ends when the daemon stops: follow it again from the last event seen, for
            // up to 30 seconds without it.
            while true {
                do {
                    lastEventID = try await follow(client, watch, after: lastEventID)
                    lost = nil
                } catch APIError.transport(let failure) {
                    let since = lost ?? monotonicSeconds()
                    lost = since
                    guard monotonicSeconds() - since < 30 else {
                        throw CLIError(status: .unreachable, description: "lost backhauld's event stream for 30 s: \(failure)")
                    }
                }
                if let failure = watch.failure { throw failure }
                if watch.isOver { return }
                await pause(1)
            }
        }
    }

    /// What the watch loop takes in, one at a time: an event, a tick of the clock (so frames
    /// move on while no event comes), or the stream's end.
    private enum Input: Sendable {
        case event(APIEvent)
        case tick
        case end(APIError?)
    }

    /// Follows the event stream until it ends or watching is over, drawing frames on events and
    /// ticks; the id of the last event received.
    private func follow(_ client: BackhaulClient, _ watch: LiveTasks, after lastEventID: String?) async throws(APIError)
        -> String?
    {
        let (inputs, feed) = AsyncStream<Input>.makeStream()
        let events = client.events(session: session, after: lastEventID)
        let reader = Task {
            do {
                for try await event in events { feed.yield(.event(event)) }
                feed.yield(.end(nil))
            } catch {
                feed.yield(.end(error as? APIError))
            }
            feed.finish()
        }
        let tick = min(max(interval, 0.1), 1)
        let ticker = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(tick))
                feed.yield(.tick)
            }
        }
        defer {
            reader.cancel()
            ticker.cancel()
        }
        var last = lastEventID
        for await input in inputs {
            switch input {
            case .event(let event):
                last = event.id ?? last
                guard await watch.apply(event) else { return last }
            case .tick:
                guard await watch.drawIfDue() else { return last }
            case .end(let failure):
                if let failure { throw failure }
                return last
            }
        }
        return last
    }
}

/// What `watch` shows, kept current: the running tasks from the event stream (each task event
/// carries the task) and the counts by state, asked again after an event that changes states.
final class LiveTasks {
    private let client: BackhaulClient
    private let session: String?
    private let interval: Double
    private let untilDone: Bool
    private let terminal = isatty(STDOUT_FILENO) == 1
    /// Running tasks by id, with when (monotonic) their data arrived.
    private var running: [String: (task: APITask, seen: Double)] = [:]
    private(set) var counts: [TaskState: Int] = [:]
    private var countsStale = true
    /// Whether anything shown changed since the last frame, and when that frame was drawn.
    private var changed = true
    private var drawn = -Double.infinity
    /// Why watching stopped early (the counts could not be read).
    private(set) var failure: APIError?

    init(client: BackhaulClient, session: String?, interval: Double, untilDone: Bool) {
        self.client = client
        self.session = session
        self.interval = interval
        self.untilDone = untilDone
    }

    /// The running tasks, oldest first, their progress carried on to `now`.
    func runningTasks(at now: Double) -> [APITask] {
        running.values.map { WatchFrame.extrapolated($0.task, by: now - $0.seen) }.sorted {
            ($0.createdAt, $0.id) < ($1.createdAt, $1.id)
        }
    }

    var isOver: Bool {
        // Suspended tasks wait for a person, not for time: they do not keep `--until-done` going.
        failure != nil || (untilDone && TaskState.unfinished.allSatisfy { $0 == .suspended || (counts[$0] ?? 0) == 0 })
    }

    /// The running tasks and the counts as they are now.
    func load() async throws(APIError) {
        for id in try await client.sessionIDs(session) {
            for task in try await client.allTasks(session: id, state: .running) {
                running[task.id] = (task, monotonicSeconds())
            }
        }
        try await refreshCounts()
    }

    private func refreshCounts() async throws(APIError) {
        guard countsStale else { return }
        var counts: [TaskState: Int] = [:]
        for id in try await client.sessionIDs(session) {
            for (state, count) in try await client.session(id).taskCounts.byState { counts[state, default: 0] += count }
        }
        self.counts = counts
        countsStale = false
    }

    /// Takes in one event; false once watching is over.
    func apply(_ event: APIEvent) async -> Bool {
        if let task = event.task {
            if task.state == .running {
                running[task.id] = (task, monotonicSeconds())
            } else {
                running.removeValue(forKey: task.id)
            }
            if event.type != "task.progress" { countsStale = true }
        } else {
            countsStale = true
        }
        changed = true
        return await drawIfDue()
    }

    /// Draws a frame when something changed (in a terminal, running tasks always move on) and
    /// `interval` has passed; false once watching is over.
    func drawIfDue() async -> Bool {
        let now = monotonicSeconds()
        guard changed || (terminal && !running.isEmpty), now - drawn >= interval else { return !isOver }
        do {
            try await refreshCounts()
        } catch {
            failure = error
            return false
        }
        if terminal { print("\u{1B}[H\u{1B}[2J", terminator: "") }
        emit(WatchFrame.render(running: runningTasks(at: now), counts: counts))
        fflush(nil)
        drawn = now
        changed = false
        return !isOver
    }
}
