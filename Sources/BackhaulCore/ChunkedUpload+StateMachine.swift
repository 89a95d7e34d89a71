import JSONValue

/// `chunked`: the file in `chunk_size` pieces, each a PUT (or the task's method) with
/// `Content-Range: bytes a-b/total`. Intermediate chunks accept 2xx and 308; the last one's 2xx
/// completes the task. On resume (a checkpoint with an offset) it first asks the server where
/// it is (`Content-Range: bytes */total`, answered 308 with `Range: bytes=0-n`, as resumable
/// upload servers do) and trusts its local record only when the server cannot say.
public struct ChunkedUpload: TransferStateMachine {
    public static let defaultChunkSize: Int64 = 8 << 20

    private enum State: Equatable {
        case idle
        case querying
        case sending(first: Int64, last: Int64)
        case done
    }

    private var state = State.idle
    private let method: String
    private let url: String
    private let headers: [(String, String)]
    private let total: Int64
    private let chunkSize: Int64
    private let checksum: Bool
    /// Bytes the server has acknowledged (the next chunk starts here).
    public private(set) var offset: Int64

    public init(task: TaskRecord, headers: [(String, String)], checkpoint: TransferCheckpoint?) {
        method = task.request.method
        url = task.request.url
        self.headers = headers
        total = task.file.size
        chunkSize = max(1, task.upload.chunkSize ?? Self.defaultChunkSize)
        checksum = task.upload.checksum == .sha256
        offset = min(checkpoint?.offset ?? 0, task.file.size)
    }

    public var bytesAcknowledged: Int64 { state == .done ? total : offset }

    public mutating func start(now: Timestamp) -> TransferStep {
        if total == 0 {
            // Nothing to range over: one empty request.
            state = .sending(first: 0, last: -1)
            return .send(PlannedRequest(method: method, url: url, headers: headers, body: .file(offset: 0, length: 0)))
        }
        if offset > 0 {
            state = .querying
            return .send(
                PlannedRequest(
                    method: method, url: url, headers: headers + [("Content-Range", "bytes */\(total)")],
                    body: .file(offset: 0, length: 0)))
        }
        return nextChunk()
    }

    public mutating func didReceive(_ response: ResponseHead, now: Timestamp) -> TransferStep {
        let status = response.status
        switch state {
        case .querying:
            if (200..<300).contains(status) {
                state = .done
                return .completed
            }
            if status == 308 {
                offset = Self.acknowledgedEnd(response.headers["range"]) ?? 0
                return offset >= total ? fail("the server has every byte but did not complete the upload") : nextChunk()
            }
            if Self.isTransient(status) { return failHTTP(response, now: now) }
            // The server cannot say where it is: go on from the local record.
            return nextChunk()
        case .sending(_, let last):
            let isLast = last + 1 >= total
            if (200..<300).contains(status) {
                if isLast {
                    state = .done
                    return .completed
                }
                offset = last + 1
                return nextChunk()
            }
            if status == 308 && !isLast {
                // Trust the server's account of what arrived, when it gives one.
                offset = Self.acknowledgedEnd(response.headers["range"]) ?? (last + 1)
                return nextChunk()
            }
            state = .idle
            return failHTTP(response, now: now)
        case .idle, .done:
            return fail("a response came when none was expected")
        }
    }

    private mutating func nextChunk() -> TransferStep {
        let first = offset
        let last = min(total, first + chunkSize) - 1
        state = .sending(first: first, last: last)
        var request = PlannedRequest(
            method: method, url: url, headers: headers + [("Content-Range", "bytes \(first)-\(last)/\(total)")],
            body: .file(offset: first, length: last - first + 1))
        // Each request's content is one chunk: its digest goes in Content-Digest.
        if checksum { request.digestTrailers = ["Content-Digest"] }
        return .send(request)
    }

    private mutating func failHTTP(_ response: ResponseHead, now: Timestamp) -> TransferStep {
        state = .idle
        return .failed(response, now: now)
    }

    private mutating func fail(_ message: String) -> TransferStep {
        state = .idle
        return .protocolViolation(message)
    }

    private static func isTransient(_ status: Int) -> Bool { RetryPlanner.transientStatuses.contains(status) }

    /// `Range: bytes=0-n` → n + 1 (the count of bytes the server holds).
    static func acknowledgedEnd(_ range: String?) -> Int64? {
        guard let range, range.hasPrefix("bytes=0-"), let last = Int64(range.dropFirst(8)) else { return nil }
        return last + 1
    }

    public var checkpoint: TransferCheckpoint? { TransferCheckpoint(offset: offset) }
}
