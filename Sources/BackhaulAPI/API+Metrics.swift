import BackhaulCore
import BackhaulQueue
import MicroHTTP

/// `GET /metrics`: the Prometheus text format (version 0.0.4). Labels take values from closed
/// sets only (states, reasons, network types), so the series stay bounded.
extension API {
    @Sendable func metrics(_ request: RouteRequest) throws(Problem) -> HTTPResponse {
        var text = PrometheusText()
        let counts = try stored { () throws(StoreError) in try store.taskCounts() }
        text.family("backhaul_tasks", "gauge", "Tasks in the store by state.")
        for state in TaskState.allCases { text.sample("backhaul_tasks", ["state": state.rawValue], Double(counts[state] ?? 0)) }
        let waiting = try stored { () throws(StoreError) in try store.waitingCounts() }
        text.family("backhaul_tasks_waiting", "gauge", "Waiting tasks by waiting_reason.")
        for reason in WaitingReason.allCases {
            text.sample("backhaul_tasks_waiting", ["reason": reason.rawValue], Double(waiting[reason] ?? 0))
        }
        let deliveries = try stored { () throws(StoreError) in try store.deliveryCounts() }
        text.family(
            "backhaul_webhook_deliveries", "gauge",
            "Webhook deliveries kept in the store, by state (failed: gave up after every retry).")
        for state in DeliveryRecord.State.allCases {
            text.sample("backhaul_webhook_deliveries", ["state": state.rawValue], Double(deliveries[state] ?? 0))
        }
        if let status, let network = try? networkInForce(refresh: false) {
            let figures = status.metrics
            text.family("backhaul_transfers_running", "gauge", "Transfers in flight.")
            text.sample("backhaul_transfers_running", [:], Double(figures.running))
            text.family("backhaul_network_info", "gauge", "The network the policy sees (1 for the one in force).")
            text.sample(
                "backhaul_network_info",
                [
                    "type": network.type.rawValue, "expensive": String(network.expensive),
                    "constrained": String(network.constrained), "source": network.source.rawValue,
                ], 1)
            text.family("backhaul_sent_bytes_total", "counter", "Request body bytes sent, by network type.")
            for type in NetworkType.allCases {
                text.sample(
                    "backhaul_sent_bytes_total", ["network_type": type.rawValue], Double(figures.bytesSentByNetwork[type] ?? 0))
            }
            text.family("backhaul_received_bytes_total", "counter", "Download body bytes received, by network type.")
            for type in NetworkType.allCases {
                text.sample(
                    "backhaul_received_bytes_total", ["network_type": type.rawValue],
                    Double(figures.bytesReceivedByNetwork[type] ?? 0))
            }
            text.family(
                "backhaul_policy_stops_total", "counter", "Running transfers the policy stopped, by the reason they wait for.")
            for reason in Policy.reasons.map(\.rawValue).sorted() + ["failed"] {
                text.sample("backhaul_policy_stops_total", ["reason": reason], Double(figures.policyStops[reason] ?? 0))
            }
            text.family("backhaul_retries_total", "counter", "Failed attempts that were retried, by kind of failure.")
            for reason in EngineMetrics.retryReasons {
                text.sample("backhaul_retries_total", ["reason": reason], Double(figures.retries[reason] ?? 0))
            }
            text.family(
                "backhaul_signer_requests_total", "counter",
                "Questions to sessions' signers, by outcome: ok, transient (retried), refused (4xx), invalid (an answer that cannot be used)."
            )
            for outcome in EngineMetrics.signerOutcomes {
                text.sample("backhaul_signer_requests_total", ["outcome": outcome], Double(figures.signerRequests[outcome] ?? 0))
            }
            text.family(
                "backhaul_engine_faults_total", "counter",
                "Things the engine could not do and logged as errors, by kind (each should be zero).")
            for fault in EngineMetrics.Fault.allCases {
                text.sample("backhaul_engine_faults_total", ["kind": fault.rawValue], Double(figures.faults[fault.rawValue] ?? 0))
            }
            text.family("backhaul_bandwidth_limit_bytes_per_second", "gauge", "The bandwidth limit in force (0: none).")
            text.sample("backhaul_bandwidth_limit_bytes_per_second", [:], Double(figures.bandwidthLimit ?? 0))
            text.family(
                "backhaul_background_rate_bytes", "gauge",
                "The rate background transfers pace at (bytes/s), summed over their paths (0: none runs).")
            text.sample("backhaul_background_rate_bytes", [:], Double(figures.backgroundRate))
            text.family(
                "backhaul_queue_delay_seconds", "gauge",
                "The largest queueing delay a background transfer's path shows (its RTT above the path's base).")
            text.sample("backhaul_queue_delay_seconds", [:], figures.queueDelay)
            text.family(
                "backhaul_discretionary_budget_remaining_bytes", "gauge", "What is left today of each discretionary budget.")
            for type in NetworkType.allCases {
                if let remaining = figures.budgetRemaining[type] {
                    text.sample(
                        "backhaul_discretionary_budget_remaining_bytes", ["network_type": type.rawValue], Double(remaining))
                }
            }
        }
        if let removal = options.fileRemoval {
            text.family(
                "backhaul_file_removals_failed_total", "counter",
                "Files a finished task let go (delete_file_on_success, a failed download's .part) that could not be removed.")
            text.sample("backhaul_file_removals_failed_total", [:], Double(removal.failures))
        }
        let maintenance = store.maintenanceFigures
        text.family("backhaul_tasks_pruned_total", "counter", "Finished tasks removed after their retention.")
        text.sample("backhaul_tasks_pruned_total", [:], Double(maintenance.tasksPruned))
        text.family(
            "backhaul_events_pruned_total", "counter", "Events removed with their tasks or after the event log's retention.")
        text.sample("backhaul_events_pruned_total", [:], Double(maintenance.eventsPruned))
        if let oldest = try? store.oldestFinishedTask(now: clock.now()) {
            text.family(
                "backhaul_oldest_finished_task_seconds", "gauge", "How long ago the oldest finished task still kept finished.")
            text.sample("backhaul_oldest_finished_task_seconds", [:], oldest.rounded())
        }
        text.family("backhaul_store_commits_total", "counter", "Transactions the store's writer committed.")
        text.sample("backhaul_store_commits_total", [:], Double(maintenance.commits))
        text.family("backhaul_wal_frames", "gauge", "Frames in the SQLite write-ahead log after the last commit.")
        text.sample("backhaul_wal_frames", [:], Double(maintenance.walFrames))
        text.family(
            "backhaul_wal_checkpoints_total", "counter",
            "WAL checkpoints by mode: passive (once the writes pause), truncate (the writer, at the log's cap, and at a clean stop), busy (one held back by another connection, or that could not copy the whole log)."
        )
        text.sample("backhaul_wal_checkpoints_total", ["mode": "passive"], Double(maintenance.passiveCheckpoints))
        text.sample("backhaul_wal_checkpoints_total", ["mode": "truncate"], Double(maintenance.truncateCheckpoints))
        text.sample("backhaul_wal_checkpoints_total", ["mode": "busy"], Double(maintenance.checkpointsBusy))
        text.family(
            "backhaul_wal_checkpoint_errors_total", "counter",
            "WAL checkpoints that failed (an I/O error, a full disk, corruption): each logged, and retried later.")
        text.sample("backhaul_wal_checkpoint_errors_total", [:], Double(maintenance.checkpointErrors))
        text.family(
            "backhaul_state_sync_failures_total", "counter",
            "Syncs of the state that failed; after the first the daemon answers no write and restarts.")
        text.sample("backhaul_state_sync_failures_total", [:], Double(maintenance.syncFailures))
        text.family("backhaul_pages_vacuumed_total", "counter", "Free pages returned to the file system (incremental vacuum).")
        text.sample("backhaul_pages_vacuumed_total", [:], Double(maintenance.pagesVacuumed))
        text.family(
            "backhaul_state_salvaged_total", "counter",
            "Damaged state databases salvaged at start (moved into corrupt-TIME/, readable rows copied into a fresh one).")
        text.sample("backhaul_state_salvaged_total", [:], store.salvage?.isNew == true ? 1 : 0)
        text.family(
            "backhaul_state_damaged", "gauge",
            "1 once SQLite found the state database damaged since the start (a read, a write or the background check); the next start salvages it."
        )
        text.sample("backhaul_state_damaged", [:], store.damage == nil ? 0 : 1)
        requestMetrics?.write(to: &text)
        return HTTPResponse(
            status: 200, headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")],
            body: Array(text.output.utf8))
    }
}

/// Writes the Prometheus text exposition format.
struct PrometheusText {
    private(set) var output = ""

    mutating func family(_ name: String, _ type: String, _ help: String) {
        output += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
    }

    mutating func sample(_ name: String, _ labels: [String: String], _ value: Double) {
        output += name
        if !labels.isEmpty {
            let pairs = labels.sorted { $0.key < $1.key }.map { "\($0.key)=\"\(Self.escape($0.value))\"" }
            output += "{" + pairs.joined(separator: ",") + "}"
        }
        let number = value.rounded() == value && abs(value) < 1e15 ? String(Int64(value)) : String(value)
        output += " \(number)\n"
    }

    static func escape(_ value: String) -> String {
        value.replacing("\\", with: "\\\\").replacing("\"", with: "\\\"").replacing("\n", with: "\\n")
    }
}
