// The peers' answers, per protocol, through the protocol machines of BackhaulCore, as the engine
// drives them: start, a response to each request, informational 1xx answers as they come, and a
// new machine from the saved checkpoint for each following attempt.
import BackhaulCore

let tusTarget = protocolTarget("tus", .tus, "tus answers: Upload-Offset, Location, Tus-* (creation, HEAD, PATCH)")
let ietfTarget = protocolTarget("ietf", .ietf, "IETF resumable answers: 104, Upload-Offset, Upload-Complete, Location")
let chunkedTarget = protocolTarget("chunked", .chunked, "chunked upload answers: Range, Location")
let singleTarget = protocolTarget("single", .raw, "raw and multipart answers: status, Retry-After, credential expiry")
let s3Target = protocolTarget("s3", .s3, "S3 answers: initiate, ListParts, complete, errors (XML), ETag")
let autoTarget = protocolTarget("auto", .auto, "auto's OPTIONS answer and the protocol it picks")
let downloadTarget = FuzzTarget(
    name: "download", surface: "download answers: Content-Range, validators, Content-Length, 416", run: runDownload)

func protocolTarget(_ name: String, _ protocolName: UploadProtocol, _ surface: String) -> FuzzTarget {
    FuzzTarget(name: name, surface: surface) { runUpload($0, protocolName: protocolName) }
}

/// The task of the first section: `key=value` words (size, chunk, offset, location, checksum,
/// interop, parts, multipart, validator, total).
func fuzzTask(_ line: String, protocolName: UploadProtocol, download: Bool) -> TaskRecord {
    var words: [String: String] = [:]
    for word in line.split(whereSeparator: { $0 == " " || $0 == "\n" }) {
        let pair = word.split(separator: "=", maxSplits: 1)
        if pair.count == 2 { words[String(pair[0])] = String(pair[1]) }
    }
    var upload = UploadSpec(protocolName: words["multipart"] != nil && protocolName == .raw ? .multipart : protocolName)
    upload.chunkSize = words["chunk"].flatMap { Int64($0) }
    upload.checksum = words["checksum"] == "sha256" ? .sha256 : nil
    upload.interopVersion = words["interop"].flatMap { Int($0) }
    if protocolName == .s3 || protocolName == .auto {
        upload.s3 = S3Credentials(region: "us-east-1", accessKeyID: "AKIDEXAMPLE", secretAccessKey: "secret")
    }
    let size = max(0, min(words["size"].flatMap { Int64($0) } ?? 2500, 1 << 40))
    var task = TaskRecord(
        id: "t", sessionID: "s", file: FileInfo(path: "/d/clip.mp4", size: size, modifiedAtNanoseconds: 0),
        request: RequestSpec(
            url: words["url"] ?? (protocolName == .s3 ? "http://127.0.0.1:9000/bucket/key" : "http://127.0.0.1:1080/files"),
            method: protocolName == .tus ? "POST" : "PUT"),
        upload: upload, createdAt: 0, deadlineAt: 100)
    if download {
        task.kind = .download
        task.download = DownloadSpec(destination: "/d/file.bin")
    }
    if let offset = words["offset"].flatMap({ Int64($0) }) {
        var checkpoint = TransferCheckpoint(
            offset: offset, attempt: 1, location: words["location"],
            parts: words["parts"].map { $0.split(separator: ",").map(String.init) } ?? [])
        checkpoint.validator = words["validator"]
        checkpoint.total = words["total"].flatMap { Int64($0) }
        checkpoint.interopVersion = words["interop"].flatMap { Int($0) }
        task.checkpoint = checkpoint
    }
    return task
}

/// A response section: the status line, header lines (`name: value`) up to an empty line, and the body.
func fuzzResponse(_ section: String) -> ResponseHead {
    var lines = section.lines[...]
    let statusLine = lines.popFirst() ?? ""
    let status = Int(statusLine.split(separator: " ").first ?? "") ?? 200
    var received: [(String, String)] = []
    while let line = lines.first, !line.isEmpty {
        lines.removeFirst()
        let pair = line.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
        received.append((String(pair[0]), pair.count > 1 ? String(pair[1].drop { $0 == " " }) : ""))
    }
    if !lines.isEmpty { lines.removeFirst() }
    let body = Array(lines.joined(separator: "\n").utf8.prefix(64 << 10))
    return ResponseHead(status: status, received: received, body: body)
}

/// What every planned request keeps to, whatever the peer said: file bodies within the file,
/// offsets never negative nor past the size.
func checkPlan(_ step: TransferStep, total: Int64, protocolName: String) {
    guard case .send(let plan) = step else { return }
    if case .file(let offset, let length) = plan.body {
        require(
            offset >= 0 && length >= 0 && offset <= total - length,
            "\(protocolName): \(plan.method) body at \(offset) length \(length) of a file of \(total)")
    }
    for (name, value) in plan.headers where name.lowercased() == "upload-offset" {
        let offset = Int64(value)
        require(offset.map { (0...total).contains($0) } ?? false, "\(protocolName): Upload-Offset \(value) of \(total)")
    }
}

/// `stored`: the task's stored checkpoint; one already broken (a negative offset, which the
/// machines refuse to resume) is kept as it is, so only the bytes shown are checked then.
func checkProgress(
    _ machine: some TransferStateMachine, total: Int64?, protocolName: String, stored: TransferCheckpoint?
) {
    let acknowledged = machine.bytesAcknowledged
    require(acknowledged >= 0 && acknowledged <= (total ?? .max), "\(protocolName): \(acknowledged) bytes acknowledged")
    if (stored?.offset ?? 0) >= 0, let offset = machine.checkpoint?.offset {
        require(offset >= 0 && offset <= (total ?? .max), "\(protocolName): checkpoint at \(offset)")
    }
}

/// Up to this many attempts per input, as the engine retries.
let maxAttempts = 4

func runUpload(_ input: FuzzInput, protocolName: UploadProtocol) {
    let sections = input.sections
    var task = fuzzTask(sections.first ?? "", protocolName: protocolName, download: false)
    let total = task.file.size
    let name = protocolName.rawValue
    var machine = TransferMachines.machine(for: task, headers: [("X-Fuzz", "1")])
    var step = machine.start(now: 0)
    var attempts = 1
    for section in sections.dropFirst() {
        checkPlan(step, total: total, protocolName: name)
        checkProgress(machine, total: total, protocolName: name, stored: task.checkpoint)
        let response = fuzzResponse(section)
        switch step {
        case .send:
            if (100..<200).contains(response.status) {
                _ = machine.didReceiveInformational(response)
            } else {
                step = machine.didReceive(response, now: 0)
            }
        case .completed, .failed:
            guard attempts < maxAttempts else { return }
            attempts += 1
            task.checkpoint = machine.checkpoint
            machine = TransferMachines.machine(for: task, headers: [("X-Fuzz", "1")])
            step = machine.start(now: Double(attempts))
        }
        _ = machine.cancellation
    }
    checkPlan(step, total: total, protocolName: name)
    checkProgress(machine, total: total, protocolName: name, stored: task.checkpoint)
}

func runDownload(_ input: FuzzInput) {
    let sections = input.sections
    var task = fuzzTask(sections.first ?? "", protocolName: .raw, download: true)
    var machine = DownloadMachine(task: task, headers: [], checkpoint: task.checkpoint)
    var step = machine.start(now: 0)
    var attempts = 1
    for section in sections.dropFirst() {
        checkProgress(machine, total: nil, protocolName: "download", stored: task.checkpoint)
        let response = fuzzResponse(section)
        switch step {
        case .send:
            if (100..<200).contains(response.status) { continue }
            if case .write(let offset, let size) = machine.didReceiveHead(response) {
                require(offset >= 0 && (size.map { $0 >= 0 } ?? true), "download: writes at \(offset) of \(size ?? -1)")
                machine.didWrite(Int64(response.body.count))
                machine.didPersist(offset: offset + Int64(response.body.count), attempt: attempts)
            }
            step = machine.didReceive(response, now: 0)
        case .completed, .failed:
            guard attempts < maxAttempts else { return }
            attempts += 1
            task.checkpoint = machine.checkpoint
            machine = DownloadMachine(task: task, headers: [], checkpoint: task.checkpoint)
            step = machine.start(now: Double(attempts))
        }
    }
    checkProgress(machine, total: nil, protocolName: "download", stored: task.checkpoint)
}
