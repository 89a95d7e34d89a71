import ArgumentParser
import BackhaulCore
import Glibc

/// `watch`: live progress from the event stream, drawn by `WatchFrame`.
struct Watch: ParsableCommand {
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

    mutating func run() throws {
        try running {
            let client = connection.client()
            let watch = LiveTasks(client: client, session: session, interval: interval, untilDone: untilDone)
            try watch.load()
            guard !once else {
                emit(WatchFrame.render(running: watch.runningTasks(at: monotonicSeconds()), counts: watch.counts))
                return
            }
            guard watch.drawIfDue() else { return }
            var lastEventID: String?
            var lost: Double?
            // The stream ends when the daemon stops: follow it again from the last event seen, for
            // up to 30 seconds without it.
            while true {
                do {
                    lastEventID = try client.followEvents(
                        session: session, after: lastEventID, receive: watch.apply, tick: watch.drawIfDue)
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
                pause(1)
            }
        }
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
    func load() throws(APIError) {
        for id in try client.sessionIDs(session) {
            for task in try client.allTasks(session: id, state: TaskState.running.rawValue) {
                running[task.id] = (task, monotonicSeconds())
            }
        }
        try refreshCounts()
    }

    private func refreshCounts() throws(APIError) {
        guard countsStale else { return }
        var counts: [TaskState: Int] = [:]
        for id in try client.sessionIDs(session) {
            for (state, count) in try client.session(id).taskCounts { counts[state, default: 0] += count }
        }
        self.counts = counts
        countsStale = false
    }

    /// Takes in one event; false once watching is over.
    func apply(_ event: APIEvent) -> Bool {
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
        return drawIfDue()
    }

    /// Draws a frame when something changed (in a terminal, running tasks always move on) and
    /// `interval` has passed; false once watching is over.
    func drawIfDue() -> Bool {
        let now = monotonicSeconds()
        guard changed || (terminal && !running.isEmpty), now - drawn >= interval else { return !isOver }
        do {
            try refreshCounts()
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
