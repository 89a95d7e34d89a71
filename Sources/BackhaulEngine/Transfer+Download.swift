import BackhaulCore
import BackhaulFiles

/// A download's body: where the state machine puts it (the `.part` file or the kept response), and
/// what is made durable before a checkpoint claims it.
extension Transfer {
    /// A download's body goes to the `.part` file, where the state machine says, once the final
    /// response's head is known; an error's body is kept (64 KiB) like an upload's response.
    func attachDownloadBody() {
        easy.onData = { [unowned self] bytes in
            if disposition == nil, !decideDisposition() { return false }
            guard case .write = disposition, let part else {
                response.append(bytes)
                return true
            }
            guard part.write(bytes) else {
                if part.isOutOfSpace { insufficientSpace = true }
                return false
            }
            received += Int64(bytes.count)
            return true
        }
    }

    /// Asks the machine where the body goes and prepares the `.part` file; false when the disk
    /// cannot hold what is coming (or the file cannot be written), which stops the request.
    @discardableResult
    func decideDisposition() -> Bool {
        guard disposition == nil, let part, let decision = withDownload({ $0.didReceiveHead(responseHead) }) else { return true }
        disposition = decision
        guard case .write(let offset, let total) = decision else { return true }
        if let total, total > offset, !part.hasRoom(for: total - offset) {
            insufficientSpace = true
            return false
        }
        return part.truncate(at: offset)
    }

    /// Makes what was received durable (fsync) and tells the machine, so the checkpoint that
    /// follows never claims bytes the disk does not hold.
    func syncPart() -> Bool {
        guard let part, case .write(let offset, _) = disposition, part.sync() else { return false }
        withDownload { $0.didPersist(offset: offset + received, attempt: attempt) }
        lastPartSync = monotonicSeconds()
        lastPartSyncOffset = offset + received
        return true
    }

    /// Hands the machine the count of body bytes written, before it sees the response's end.
    func endDownloadBody() {
        guard part != nil else { return }
        if disposition == nil { decideDisposition() }
        withDownload { $0.didWrite(received) }
    }

    /// Changes the download's state machine in place (nil for an upload).
    @discardableResult
    func withDownload<T>(_ change: (inout DownloadMachine) -> T) -> T? {
        guard var download = machine as? DownloadMachine else { return nil }
        let result = change(&download)
        machine = download
        return result
    }
}
