import BackhaulCore
import BackhaulQueue
import Curl

/// The engine loop's side of the policy: deciding for running and held tasks, counting budgets,
/// sharing the bandwidth limit.
extension EngineLoop {
    /// The inputs of `Policy.decide` now.
    func policyContext() -> PolicyContext {
        let now = clock.now()
        let local = LocalTime.components(of: now)
        if local.day != budgetDay {
            // A new day: budgets start again (what was spent today survives restarts in the store).
            flushBudget(force: true)
            do {
                budgetUsed = try store.budgetUsage(day: local.day)
                budgetDay = local.day
            } catch {
                // Unknown use counts as spent (discretionary tasks wait) until it can be read.
                fault(.storeRead, "cannot read today's budget use; discretionary budgets count as spent", ["error": "\(error)"])
                budgetUsed = policy.discretionaryDailyBudget
            }
        }
        return PolicyContext(network: network, policy: policy, now: now, minuteOfDay: local.minute, budgetUsed: budgetUsed)
    }

    /// Decides again for every running task and every task the policy holds: running ones no
    /// longer allowed stop and wait (resumable ones keep their checkpoint), held ones now allowed
    /// go back to the queue. Then the next clock edge is noted.
    func reevaluatePolicy(_ transfers: CurlTransfers) {
        policyReviewNeeded = false
        let detected = engine.network
        if detected.type != network.type {
            // What the running transfers sent so far went over the network they started on.
            for transfer in active.values { countSent(transfer, bytes: transfer.bytesMoved) }
        }
        network = detected
        policy = engine.settings.policy
        budgetExceeded = false
        let context = policyContext()
        var stopped: [(Transfer, PolicyDecision)] = []
        for transfer in Array(active.values) {
            let decision = Policy.decide(transfer.configuration, in: context)
            guard decision != .run else { continue }
            logger.info(
                "the policy stops a transfer", metadata: ["task.id": "\(transfer.task.id)", "policy.decision": "\(decision)"])
            if case .wait(let reason) = decision {
                metrics.policyStops[reason.rawValue, default: 0] += 1
            } else {
                metrics.policyStops["failed", default: 0] += 1
            }
            release(transfer)
            stopped.append((transfer, decision))
        }
        // The figures (bytes sent, stops) are published before the stops are written, so a
        // client that sees a task waiting finds them in /metrics.
        if !stopped.isEmpty { publishProgress(force: true) }
        for (transfer, decision) in stopped {
            switch decision {
            case .wait(let reason):
                record(transfer, .held(reason))
            case .fail(let error):
                record(transfer, .failed(error, nil))
            case .run:
                break
            }
        }
        var after: Int64 = 0
        let started = monotonicSeconds()
        while monotonicSeconds() - started < 5 {
            let page: [HeldTask]
            do {
                page = try store.policyHeldTasks(afterSequence: after, limit: 500)
            } catch {
                fault(.storeRead, "cannot read the tasks the policy holds; deciding again next turn", ["error": "\(error)"])
                policyReviewNeeded = true
                break
            }
            guard let last = page.last else { break }
            after = last.sequence
            for held in page {
                guard let session = sessionConfigurations[held.sessionID] else { continue }
                let configuration: TransferConfiguration
                do {
                    configuration =
                        held.configurationOverrides.isEmpty ? session : try session.applying(.object(held.configurationOverrides))
                } catch {
                    fault(
                        .invalidConfiguration, "a task's configuration cannot be applied; the task fails",
                        ["task.id": "\(held.id)", "error": "\(error)"])
                    store.applyPolicy(
                        sequence: held.sequence,
                        .fail(
                            TaskError(
                                .unknown,
                                message: "the task's configuration cannot be applied over its session's: \(error)")))
                    continue
                }
                var decision = Policy.decide(configuration, in: context)
                // Held for credentials and free to run: the queue takes it back once the chain
                // holds keys (it wakes the loop for a review when a lookup ends); meanwhile its
                // reason follows the source the chain asks.
                if WaitingReason.awsCredentialReasons.contains(held.reason), decision == .run,
                    let chain = options.awsCredentials, chain.keys() == nil
                {
                    decision = .wait(.awsCredentials(from: chain.source))
                }
                guard decision != .wait(held.reason) else { continue }
                applyPolicy(sequence: held.sequence, decision)
            }
        }
        let local = LocalTime.components(of: context.now)
        nextPolicyEdge = context.now - local.second + Double(policy.minutesToNextEdge(minuteOfDay: local.minute) * 60)
        scheduleNeeded = true
        bandwidthDirty = true
        // The policy may have made running discretionary transfers background, or no longer.
        backgroundRunning = true
        publishProgress(force: true)
    }

    /// Counts what a transfer sent since last counted, by network type; a discretionary
    /// transfer's bytes also go to today's budget, and past the budget decisions are made again.
    func countSent(_ transfer: Transfer, bytes: Int64) {
        let delta = max(0, bytes - transfer.budgetCounted)
        transfer.budgetCounted = bytes
        guard delta > 0 else { return }
        if transfer.part == nil {
            metrics.bytesSentByNetwork[network.type, default: 0] += delta
        } else {
            metrics.bytesReceivedByNetwork[network.type, default: 0] += delta
        }
        guard transfer.configuration.discretionary else { return }
        budgetUsed[network.type, default: 0] += delta
        budgetPending[network.type, default: 0] += delta
        if let budget = policy.discretionaryDailyBudget[network.type], budgetUsed[network.type, default: 0] >= budget {
            budgetExceeded = true
        }
    }

    func flushBudget(force: Bool) {
        let now = monotonicSeconds()
        guard !budgetPending.isEmpty, force || now - lastBudgetFlush >= 1, !budgetDay.isEmpty else { return }
        lastBudgetFlush = now
        store.addBudgetUsage(day: budgetDay, budgetPending)
        budgetPending.removeAll()
    }

    /// Shares the bandwidth limit in force equally among running transfers
    /// (`CURLOPT_MAX_SEND_SPEED_LARGE` on each; 0 lifts it).
    func applyBandwidth() {
        bandwidthDirty = false
        let local = LocalTime.components(of: clock.now())
        let limit = policy.bandwidth(minuteOfDay: local.minute, network: network.type)
        let share = limit.map { max(1024, $0 / Int64(max(1, active.count))) } ?? 0
        for transfer in active.values {
            do { try transfer.limitSpeed(share) } catch {
                fault(
                    .curl, "cannot apply the bandwidth limit to a transfer",
                    ["task.id": "\(transfer.task.id)", "error": "\(error)"])
            }
        }
    }
}
