import JSONValue

/// `chunked`: the file in `chunk_size` pieces, each a PUT (or the task's method) with
/// `Content-Range: bytes a-b/total`. Intermediate chunks accept 2xx and 308; the last one's 2xx
/// completes the task. On resume (a checkpoint with an offset) it first asks the server where
/// it is (`Content-Range: bytes */total`, answered 308 with `Range: bytes=0-n`, as resumable
/// upload servers do) and trusts its local record only when the server cannot say.
public struct ChunkedUpload: TransferStateMachine {
    public static let defaultChunkSize: Int64 = 8 << 20

    /// The size of a piece: the one asked for (at least a byte), no larger than the file, so that
    /// an offset plus a chunk stays far from overflowing whatever the stored row says.
    static func chunkSize(_ requested: Int64?, total: Int64) -> Int64 {
        min(max(1, requested ?? defaultChunkSize), max(1, total))
    }

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
    /// A stored offset below zero: no attempt can have written it.
    private let brokenOffset: Int64?

    public init(task: TaskRecord, headers: [(String, String)], checkpoint: TransferCheckpoint?) {
        method = task.request.method
        url = task.request.url
        self.headers = headers
        total = task.file.size
        chunkSize = Self.chunkSize(task.upload.chunkSize, total: task.file.size)
        checksum = task.upload.checksum == .sha256
        offset = min(checkpoint?.offset ?? 0, task.file.size)
        brokenOffset = offset < 0 ? offset : nil
    }

    /// Never below zero, though a broken stored checkpoint may say so (`brokenOffset`).
    public var bytesAcknowledged: Int64 { state == .done ? total : max(0, offset) }

    public mutating func start(now: Timestamp) -> TransferStep {
        if let brokenOffset {
            state = .idle
            return .impossible("the stored checkpoint has the negative offset \(brokenOffset)")
        }
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
            if status == 308 { return resync(Self.acknowledgedEnd(response.headers["range"]) ?? 0) }
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
                return resync(Self.acknowledgedEnd(response.headers["range"]) ?? (last + 1))
            }
            state = .idle
            return failHTTP(response, now: now)
        case .idle, .done:
            return fail("a response came when none was expected")
        }
    }

    /// Goes on from what the server says it holds; all of the file (or more) held but not
    /// completed is a broken server, and is not counted.
    private mutating func resync(_ held: Int64) -> TransferStep {
        guard held < total else { return fail("the server has every byte but did not complete the upload") }
        offset = held
        return nextChunk()
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

    private static func isTransient(_ status: Int) -> Bool { TransientAnswers.httpStatuses.contains(status) }

    /// `Range: bytes=0-n` → n + 1 (the count of bytes the server holds); nil for anything else,
    /// a negative or overflowing `n` included.
    static func acknowledgedEnd(_ range: String?) -> Int64? {
        guard let range, range.hasPrefix("bytes=0-"), let last = Int64(range.dropFirst(8)), last >= 0, last < .max else {
            return nil
        }
        return last + 1
    }

    public var checkpoint: TransferCheckpoint? { TransferCheckpoint(offset: offset) }
}
