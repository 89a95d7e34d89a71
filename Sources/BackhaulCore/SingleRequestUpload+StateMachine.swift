/// `raw` and `multipart`: the whole file in one request; success is any 2xx.
public struct SingleRequestUpload: TransferStateMachine {
    private enum State: Equatable { case idle, sent, done }
    private var state = State.idle
    private var request: PlannedRequest
    private let fileSize: Int64

    public init(task: TaskRecord, headers: [(String, String)]) {
        fileSize = task.file.size
        var headers = headers
        let body: PlannedBody
        switch task.upload.protocolName {
        case .multipart:
            body = .multipart(
                MultipartPlan(
                    fields: task.upload.fields.map { FormField(name: $0.0, value: $0.1) },
                    fileField: task.upload.field,
                    filename: task.upload.filename ?? String(task.file.path.split(separator: "/").last ?? "file"),
                    contentType: task.upload.contentType ?? "application/octet-stream",
                    fileLength: task.file.size,
                    digestField: task.upload.checksum == .sha256 ? MultipartPlan.digestFieldName : nil))
        default:
            body = .file(offset: 0, length: task.file.size)
            if let type = task.upload.contentType, !headers.contains(where: { $0.0.lowercased() == "content-type" }) {
                headers.append(("Content-Type", type))
            }
        }
        request = PlannedRequest(method: task.request.method, url: task.request.url, headers: headers, body: body)
        if task.upload.checksum == .sha256, task.upload.protocolName == .raw {
            // The whole representation is the body: both digests are the same.
            request.digestTrailers = ["Repr-Digest", "Content-Digest"]
        }
    }

    public mutating func start(now: Timestamp) -> TransferStep {
        state = .sent
        return .send(request)
    }

    public mutating func didReceive(_ response: ResponseHead, now: Timestamp) -> TransferStep {
        guard state == .sent else { return .protocolViolation("unexpected response") }
        if (200..<300).contains(response.status) {
            state = .done
            return .completed
        }
        state = .idle
        return .failed(response, now: now)
    }

    public var bytesAcknowledged: Int64 { state == .done ? fileSize : 0 }
}
