import BackhaulCore
import Logging
import Threads

/// The steps of a stop, watched: a step that runs past `patience` seconds is logged by name, and
/// again every `patience` seconds while it runs, so a stop that hangs says where (a supervisor's
/// SIGKILL otherwise ends it without a word).
final class StopSteps: Sendable {
    private let logger: Logger
    private let patience: Double
    private let current = Locked((step: "", began: 0.0, done: false))
    private let watcher = WorkerThread(name: "bh-stopwatch")

    init(logger: Logger, patience: Double) {
        self.logger = logger
        self.patience = patience
        watcher.start { [self] in watch() }
    }

    func run(_ step: String, _ body: () -> Void) {
        current.withLockNotifyingAll { $0 = (step, monotonicSeconds(), false) }
        body()
        let took = monotonicSeconds() - current.withLock { $0.began }
        if took > 2 { logger.info("a stop step was slow", metadata: ["stop.step": "\(step)", "stop.seconds": "\(took)"]) }
    }

    func finish() {
        current.withLockNotifyingAll { $0.done = true }
        watcher.join()
    }

    private func watch() {
        while !current.wait(until: { $0.done }, timeout: patience, { $0.done }) {
            let (step, began) = current.withLock { ($0.step, $0.began) }
            let ran = monotonicSeconds() - began
            guard ran >= patience else { continue }
            logger.warning("the stop waits on one step", metadata: ["stop.step": "\(step)", "stop.seconds": "\(Int(ran))"])
        }
    }
}
