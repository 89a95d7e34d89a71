import BackhaulCore
import Curl

/// The end of a download: its `.part` file verified off the loop, then renamed into place; or
/// the task cancelled when the disk cannot hold it.
extension EngineLoop {
    /// Downloads the verifier is done with: a task still in that attempt is renamed into place
    /// and completes, or fails with the verifier's error. One whose task moved on meanwhile
    /// (cancelled, say) is left alone: the store removes its `.part` file.
    func placeVerifiedDownloads(_ transfers: CurlTransfers) {
        for outcome in verifier.take() {
            guard let transfer = active[outcome.taskID], transfer.attempt == outcome.attempt, transfer.verifying,
                let part = transfer.part, let spec = transfer.task.download
            else { continue }
            let error = outcome.error ?? part.place(overwrite: spec.overwrite)
            release(transfer)
            let bytes = transfer.machine.bytesAcknowledged
            if let error {
                if error.reason == .pathChanged { part.discard() }
                logger.info("download failed", metadata: ["task.id": "\(outcome.taskID)", "error.name": "\(error.name)"])
                record(transfer, bytesTransferred: bytes, .failed(error, transfer.responseRecord))
            } else {
                record(transfer, bytesTransferred: bytes, .completed(transfer.responseRecord))
            }
        }
    }

    /// The disk cannot hold the download: the task is cancelled with reason 2 (the store removes
    /// its `.part` file, as for every download that ends without completing).
    func cancelForLackOfSpace(_ transfer: Transfer) {
        release(transfer)
        logger.warning("not enough disk space for a download", metadata: ["task.id": "\(transfer.task.id)"])
        let total = transfer.withDownload { $0.total } ?? nil
        record(
            transfer, bytesTransferred: 0,
            .cancelled(
                .insufficientSystemResources,
                "cancelled: the disk cannot hold the download" + (total.map { " (\($0) bytes)" } ?? "")))
    }
}
