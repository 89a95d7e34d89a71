import BackhaulCore
import Curl

/// Issue 18's engine side: informational responses handed to the machine mid-request (an IETF
/// `104` naming the upload resource, persisted at once), and `auto`'s per-host picks. `begin`
/// calls `makeMachine` and `watchInformational`, `finished` calls `rememberSelection`; the cache
/// itself is `EngineLoop.protocolSelections`.
extension EngineLoop {
    /// How long an `auto` pick is trusted for a session's host before the next task asks again.
    static let selectionLifetime: Double = 3600

    /// The machine of a task's attempt. An `auto` task that has not picked yet gets the pick a task
    /// of the same session made for the same host (`key`) within `selectionLifetime`.
    func makeMachine(for task: TaskRecord, headers: [(String, String)], key: Scheduler.Key) -> any TransferStateMachine {
        var cached: ProtocolSelection.Choice?
        if task.kind == .upload, task.upload.protocolName == .auto, let entry = protocolSelections[key],
            monotonicSeconds() - entry.at < Self.selectionLifetime
        {
            cached = entry.choice
        }
        return TransferMachines.machine(for: task, headers: headers, cachedSelection: cached)
    }

    /// After each response: keeps what an `auto` task picked for its session and host (a pick
    /// that changed, a fallback's new one included, replaces the old).
    func rememberSelection(_ transfer: Transfer) {
        guard let auto = transfer.machine as? AutoUpload, let choice = auto.selection else { return }
        let key = transfer.limitKey
        if let known = protocolSelections[key], known.choice == choice, monotonicSeconds() - known.at < Self.selectionLifetime {
            return
        }
        protocolSelections[key] = (choice, monotonicSeconds())
        logger.info(
            "auto picked a protocol for the host",
            metadata: [
                "task.id": "\(transfer.task.id)", "upload.protocol_selected": "\(choice.protocolName.rawValue)",
                "upload.interop_version": "\(choice.interopVersion.map(String.init) ?? "-")",
            ])
    }

    /// Routes the transfer's informational responses to `receivedInformational` (curl hands their
    /// headers over before the final response's, from inside `curl_multi_perform`).
    func watchInformational(_ transfer: Transfer) {
        transfer.response.onInformational = { [unowned self, unowned transfer] _ in receivedInformational(transfer) }
    }

    /// Hands a 1xx to the machine and, when its checkpoint changed, persists it before curl reads
    /// on: a SIGKILL between an IETF `104` and the final answer then resumes the same upload.
    /// (Runs inside a curl callback: it touches the store, never curl.)
    func receivedInformational(_ transfer: Transfer) {
        guard active[transfer.task.id] === transfer else { return }
        let status = transfer.response.status
        let known = transfer.checkpoint.location
        let head = ResponseHead(status: status, received: transfer.response.headers)
        guard transfer.machine.didReceiveInformational(head) else { return }
        if let refused = locationRefusal(transfer) {
            // Not persisted, never asked: the request stops at the next progress call.
            transfer.refusedLocation = refused
            return
        }
        persistCheckpoint(transfer)
        if transfer.checkpoint.location != known {
            logger.info(
                "upload resource saved",
                metadata: [
                    "task.id": "\(transfer.task.id)", "http.status": "\(status)",
                    "upload.protocol": "\(transfer.task.upload.protocolName.rawValue)",
                ])
        }
    }
}
