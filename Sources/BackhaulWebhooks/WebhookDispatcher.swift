import BackhaulCore
import BackhaulQueue
import Curl
import Digest
import Logging
import Threads

public struct DispatcherOptions: Sendable {
    /// Deliveries in flight at once.
    public var maxInFlight = 16
    /// Delays before each attempt (the first is the initial one).
    public var schedule = DeliveryPlan.standardSchedule
    /// One attempt's whole time limit, seconds.
    public var requestTimeout = 15
    public var userAgent = "backhauld-webhooks"
    public var caBundle: String?
    /// Refuse receivers whose connected address is not public (`--deny-private-destinations`).
    public var denyPrivateDestinations = false

    public init() {}
}

/// Delivers the outbox: a client of the shared curl loop (so webhook connections are pooled
/// with the transfers'), a bounded pool of POSTs. Woken when a commit adds events; otherwise it
/// waits until the next retry is due.
public final class WebhookDispatcher: Sendable {
    fileprivate struct Shared {
        var wake = true
        var stopping = false
        var stopped = false
        /// Deliveries whose attempt is being written: not due again until it is.
        var recording: Set<Int64> = []
    }

    private let store: any StateStore
    private let curlLoop: CurlLoop
    private let logger: Logger
    private let options: DispatcherOptions
    private let clock: any Clock
    fileprivate let shared = Locked(Shared())

    public init(
        store: any StateStore, curlLoop: CurlLoop, logger: Logger, options: DispatcherOptions = DispatcherOptions(),
        clock: any Clock = SystemClock()
    ) {
        self.store = store
        self.curlLoop = curlLoop
        self.logger = logger
        self.options = options
        self.clock = clock
        // Woken by deliveries queued, not by every event: a session without subscriptions appends
        // events that have nothing to deliver, and each wake read the outbox twice.
        store.observe { [shared, curlLoop] changes in
            guard changes.deliveriesAdded else { return }
            shared.withLock { $0.wake = true }
            curlLoop.wake()
        }
    }

    /// Joins the curl loop (which must then be started).
    public func start() {
        curlLoop.register(DispatchLoop(store: store, logger: logger, options: options, clock: clock, shared: shared))
    }

    /// New events or a change of subscriptions: look for due deliveries now.
    public func wake() {
        shared.withLock { $0.wake = true }
        curlLoop.wake()
    }

    /// Stops; deliveries in flight stay pending and are sent again, with the same `webhook-id`,
    /// after the next start.
    public func shutdown() {
        shared.withLock { $0.stopping = true }
        curlLoop.wake()
        shared.wait(until: { $0.stopped }, timeout: 30) { _ in }
    }

    fileprivate final class DispatchLoop: CurlLoopClient {
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

        let store: any StateStore
        let logger: Logger
        let options: DispatcherOptions
        let clock: any Clock
        let shared: Locked<Shared>
        var inFlight: [ObjectIdentifier: InFlight] = [:]
        var nextDue: Timestamp?
        private(set) var isDone = false

        init(store: any StateStore, logger: Logger, options: DispatcherOptions, clock: any Clock, shared: Locked<Shared>) {
            self.store = store
            self.logger = logger
            self.options = options
            self.clock = clock
            self.shared = shared
        }

        func turn(_ transfers: CurlTransfers) {
            let (wake, stopping) = shared.withLock { state in
                defer { state.wake = false }
                return (state.wake, state.stopping)
            }
            if stopping {
                for item in inFlight.values { transfers.remove(item.easy) }
                inFlight.removeAll()
                isDone = true
                shared.withLockNotifyingAll { $0.stopped = true }
                return
            }
            let now = clock.now()
            if inFlight.count < options.maxInFlight, wake || (nextDue.map { $0 <= now } ?? false) { fill(now: now, transfers) }
        }

        func finished(_ easy: EasyHandle, _ code: CurlCode, _ transfers: CurlTransfers) {
            guard let item = inFlight.removeValue(forKey: ObjectIdentifier(easy)) else { return }
            let status = code == .ok ? item.response.status : nil
            let retryAfter = item.response.header("retry-after").flatMap { RetryAfter.parse($0, now: clock.now()) }
            record(item.delivery, status: status, error: code == .ok ? nil : code.message, retryAfter: retryAfter)
            shared.withLock { $0.wake = true }
        }

        func afterPerform(_ transfers: CurlTransfers) {}

        /// A full pool waits for completions (their sockets wake the poll), not for due times.
        var sleepLimit: Double? {
            guard let nextDue, inFlight.count < options.maxInFlight else { return nil }
            return max(0, nextDue - clock.now())
        }

        /// Starts due deliveries up to the pool size and learns when the next one is due.
        func fill(now: Timestamp, _ transfers: CurlTransfers) {
            let free = options.maxInFlight - inFlight.count
            do {
                let busy = Set(inFlight.values.map(\.delivery.sequence)).union(shared.withLock { $0.recording })
                if free > 0 {
                    for delivery in try store.dueDeliveries(now: now, limit: free, excluding: busy) {
                        start(delivery, now: now, transfers)
                    }
                }
                nextDue = try store.nextDeliveryAt(excluding: busy)
            } catch {
                logger.error("cannot read the outbox", metadata: ["error": "\(error)"])
                nextDue = now + 1
            }
        }

        func start(_ delivery: PendingDelivery, now: Timestamp, _ transfers: CurlTransfers) {
            do {
                let item = try InFlight(delivery)
                if options.denyPrivateDestinations { item.easy.allowPeer = { !DestinationRules.isPrivate(address: $0) } }
                let timestamp = Int64(now)
                var request = RequestOptions(url: delivery.url, method: .post)
                request.body = .stream(length: Int64(delivery.payload.count))
                request.timeoutSeconds = options.requestTimeout
                request.userAgent = options.userAgent
                request.caBundle = options.caBundle
                request.headers = WebhookSigner.headerLines(
                    keys: delivery.secrets.compactMap(WebhookRecord.key(of:)), id: delivery.eventID, timestamp: timestamp,
                    body: delivery.payload)
                try item.easy.configure(request)
                try transfers.add(item.easy, for: self)
                inFlight[ObjectIdentifier(item.easy)] = item
            } catch {
                logger.error("cannot start a delivery", metadata: ["webhook.id": "\(delivery.webhookID)", "error": "\(error)"])
                record(delivery, status: nil, error: "\(error)", retryAfter: nil)
            }
        }

        func record(_ delivery: PendingDelivery, status: Int?, error: String?, retryAfter: Double?) {
            let decision = DeliveryPlan.decide(
                status: status, retryAfter: retryAfter, attempts: delivery.attempts + 1,
                now: clock.now(), schedule: options.schedule)
            if decision != .delivered {
                logger.info(
                    "webhook delivery failed",
                    metadata: [
                        "webhook.id": "\(delivery.webhookID)", "event.id": "\(delivery.eventID)",
                        "delivery.attempt": "\(delivery.attempts + 1)", "http.status": "\(status.map(String.init) ?? "none")",
                        "delivery.decision": "\(decision)",
                    ])
            }
            shared.withLock { _ = $0.recording.insert(delivery.sequence) }
            store.recordDeliveryAttempt(sequence: delivery.sequence, status: status, error: error, decision: decision) {
                [logger, shared] failure in
                if let failure { logger.error("cannot record a delivery", metadata: ["error": "\(failure)"]) }
                shared.withLock {
                    $0.recording.remove(delivery.sequence)
                    $0.wake = true
                }
            }
        }
    }
}
