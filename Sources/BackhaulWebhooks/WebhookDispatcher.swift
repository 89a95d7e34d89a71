import BackhaulCore
import Threads
import BackhaulStore
import CCurl
import Curl
import Glibc
import Logging

public struct DispatcherOptions: Sendable {
    /// Deliveries in flight at once.
    public var maxInFlight = 16
    /// Delays before each attempt (the first is the initial one).
    public var schedule = DeliveryPlan.standardSchedule
    /// One attempt's whole time limit, seconds.
    public var requestTimeout = 15
    /// How long delivered events and finished deliveries are kept.
    public var retention: Double = 7 * 86_400
    public var userAgent = "backhauld-webhooks"
    public var caBundle: String?
    /// Refuse receivers whose connected address is not public (`--deny-private-destinations`).
    public var denyPrivateDestinations = false

    public init() {}
}

/// Delivers the outbox: one thread, one curl multi handle (the engine's curl layer), a bounded
/// pool of POSTs. Woken when a write adds events; otherwise it sleeps until the next retry.
public final class WebhookDispatcher: Sendable {
    private struct Shared {
        var wake = true
        var stopping = false
    }

    private let store: Store
    private let logger: Logger
    private let options: DispatcherOptions
    private let clock: any Clock
    private let shared = Locked(Shared())
    private let waker: MultiWaker
    private let thread = WorkerThread()
    private nonisolated(unsafe) let multi: MultiHandle
    private nonisolated(unsafe) var loop: DispatchLoop?

    public init(store: Store, logger: Logger, options: DispatcherOptions = DispatcherOptions(),
                clock: any Clock = SystemClock()) throws {
        self.store = store
        self.logger = logger
        self.options = options
        self.clock = clock
        multi = try MultiHandle()
        waker = multi.waker
    }

    public func start() {
        loop = DispatchLoop(store: store, logger: logger, options: options, clock: clock, multi: multi) { [shared] in
            shared.withLock { state in
                defer { state.wake = false }
                return (state.wake, state.stopping)
            }
        }
        thread.start { [self] in loop!.run() }
    }

    /// New events (or a change of subscriptions): look for due deliveries now.
    public func wake() {
        shared.withLock { $0.wake = true }
        waker.wake()
    }

    /// Stops; deliveries in flight stay pending and are sent again, with the same
    /// `webhook-id`, after the next start.
    public func shutdown() {
        shared.withLock { $0.stopping = true }
        waker.wake()
        thread.join()
    }
}

private final class DispatchLoop {
    final class InFlight {
        let delivery: PendingDelivery
        let easy: EasyHandle
        let response = ResponseCollector(bodyLimit: 1024)
        let body: MemoryBody

        init(_ delivery: PendingDelivery) throws {
            self.delivery = delivery
            easy = try EasyHandle()
            body = MemoryBody(delivery.payload)
            response.attach(to: easy)
            body.attach(to: easy)
        }
    }

    let store: Store
    let logger: Logger
    let options: DispatcherOptions
    let clock: any Clock
    let multi: MultiHandle
    let takeSignals: () -> (wake: Bool, stopping: Bool)
    var inFlight: [ObjectIdentifier: InFlight] = [:]
    var nextDue: Timestamp?
    var lastPrune = 0.0

    init(store: Store, logger: Logger, options: DispatcherOptions, clock: any Clock, multi: MultiHandle,
         takeSignals: @escaping () -> (wake: Bool, stopping: Bool)) {
        self.store = store
        self.logger = logger
        self.options = options
        self.clock = clock
        self.multi = multi
        self.takeSignals = takeSignals
    }

    func run() {
        while true {
            let (wake, stopping) = takeSignals()
            if stopping { break }
            let now = clock.now()
            let poolFull = inFlight.count >= options.maxInFlight
            if !poolFull, wake || (nextDue.map { $0 <= now } ?? false) { fill(now: now) }
            do { try multi.perform() } catch { logger.error("curl_multi_perform failed", metadata: ["error": "\(error)"]) }
            var finishedAny = false
            for (easy, code) in multi.completed() {
                guard let item = inFlight.removeValue(forKey: ObjectIdentifier(easy)) else { continue }
                finished(item, code: code)
                finishedAny = true
            }
            if finishedAny { fill(now: clock.now()) }
            if monotonicSeconds() - lastPrune > 600 {
                lastPrune = monotonicSeconds()
                do { try store.prune(olderThan: options.retention) } catch {
                    logger.warning("cannot prune the event log", metadata: ["error": "\(error)"])
                }
            }
            // A full pool waits for completions (their sockets wake the poll), not for due times.
            var timeout = 1000.0
            if let nextDue, inFlight.count < options.maxInFlight { timeout = min(timeout, max(0, (nextDue - clock.now()) * 1000)) }
            do { try multi.poll(timeoutMilliseconds: Int(timeout.rounded(.up))) } catch {
                logger.error("curl_multi_poll failed", metadata: ["error": "\(error)"])
            }
        }
        for item in inFlight.values { multi.remove(item.easy) }
        inFlight.removeAll()
    }

    /// Starts due deliveries up to the pool size and learns when the next one is due.
    func fill(now: Timestamp) {
        let free = options.maxInFlight - inFlight.count
        do {
            if free > 0 {
                let busy = Set(inFlight.values.map(\.delivery.sequence))
                for delivery in try store.dueDeliveries(now: now, limit: free, excluding: busy) { start(delivery, now: now) }
            }
            nextDue = try store.nextDeliveryAt(excluding: Set(inFlight.values.map(\.delivery.sequence)))
        } catch {
            logger.error("cannot read the outbox", metadata: ["error": "\(error)"])
        }
    }

    func start(_ delivery: PendingDelivery, now: Timestamp) {
        do {
            let item = try InFlight(delivery)
            if options.denyPrivateDestinations { item.easy.allowPeer = { !DestinationRules.isPrivate(address: $0) } }
            let timestamp = Int64(now)
            let easy = item.easy
            try easy.set(CURLOPT_URL, delivery.url)
            try easy.set(CURLOPT_NOSIGNAL, 1)
            try easy.set(CURLOPT_PROTOCOLS_STR, "http,https")
            try easy.set(CURLOPT_UPLOAD, 1)
            try easy.set(CURLOPT_CUSTOMREQUEST, "POST")
            try easy.set(CURLOPT_INFILESIZE_LARGE, offset: Int64(delivery.payload.count))
            try easy.set(CURLOPT_TIMEOUT, options.requestTimeout)
            try easy.set(CURLOPT_USERAGENT, options.userAgent)
            if let bundle = options.caBundle { try easy.set(CURLOPT_CAINFO, bundle) }
            try easy.setHeaders([
                "Content-Type: application/json",
                "webhook-id: \(delivery.eventID)",
                "webhook-timestamp: \(timestamp)",
                "webhook-signature: \(WebhookSigner.header(secrets: delivery.secrets, id: delivery.eventID, timestamp: timestamp, body: delivery.payload))",
                "Expect:",
            ])
            try multi.add(easy)
            inFlight[ObjectIdentifier(easy)] = item
        } catch {
            logger.error("cannot start a delivery", metadata: ["webhook.id": "\(delivery.webhookID)", "error": "\(error)"])
            record(delivery, status: nil, error: "\(error)", retryAfter: nil)
        }
    }

    func finished(_ item: InFlight, code: CurlCode) {
        let status = code == .ok ? item.response.status : nil
        let retryAfter = item.response.header("retry-after").flatMap { RetryAfter.parse($0, now: clock.now()) }
        record(item.delivery, status: status, error: code == .ok ? nil : code.message, retryAfter: retryAfter)
    }

    func record(_ delivery: PendingDelivery, status: Int?, error: String?, retryAfter: Double?) {
        let decision = DeliveryPlan.decide(status: status, retryAfter: retryAfter, attempts: delivery.attempts + 1,
                                           now: clock.now(), schedule: options.schedule)
        if decision != .delivered {
            logger.info("webhook delivery failed", metadata: [
                "webhook.id": "\(delivery.webhookID)", "event.id": "\(delivery.eventID)",
                "delivery.attempt": "\(delivery.attempts + 1)", "http.status": "\(status.map(String.init) ?? "none")",
                "delivery.decision": "\(decision)",
            ])
        }
        do {
            try store.recordDeliveryAttempt(sequence: delivery.sequence, status: status, error: error, decision: decision)
        } catch {
            logger.error("cannot record a delivery", metadata: ["error": "\(error)"])
        }
    }
}
