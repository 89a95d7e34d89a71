import Foundation
import Logging
import Testing
import Threads

@testable import BackhaulServer

/// Keeps what is logged, for a test to read.
private struct CapturingLogHandler: LogHandler {
    let lines: Locked<[(message: String, metadata: Logger.Metadata)]>
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        lines.withLock { $0.append((event.message.description, event.metadata ?? [:])) }
    }
}

@Suite("A stop's steps")
struct StopStepsTests {
    @Test("a step that runs past the patience is logged by name while it runs; a quick one is not")
    func hangingStepIsNamed() {
        let lines = Locked<[(message: String, metadata: Logger.Metadata)]>([])
        let logger = Logger(label: "test") { _ in CapturingLogHandler(lines: lines) }
        let steps = StopSteps(logger: logger, patience: 0.2)
        steps.run("the quick one") {}
        steps.run("the stuck one") { usleep(700_000) }
        steps.finish()
        let waits = lines.withLock { $0 }.filter { $0.message == "the stop waits on one step" }
        #expect(waits.count >= 2, "\(lines.withLock { $0 })")
        #expect(waits.allSatisfy { $0.metadata["stop.step"]?.description == "the stuck one" })
    }
}
