// What other programs answer the daemon: header values on their own, S3's XML, credential
// sources, signers, PostgreSQL's change messages and stored rows, D-Bus property values.
import BackhaulQueue
import Foundation
import JSONCodec
import Logging
import Systemd

@testable import BackhaulCore
@testable import BackhaulEngine
@testable import BackhaulPostgres

let headersTarget = FuzzTarget(
    name: "headers",
    surface: "header values: Retry-After, Location, URLs, Content-Range, ETag, Range, structured "
        + "fields, auto's OPTIONS answer, credential expiry; the routing table", run: runHeaders)
let xmlTarget = FuzzTarget(name: "xml", surface: "S3's XML documents read alone (first, blocks, unescape)", run: runXML)
let credentialsTarget = FuzzTarget(
    name: "credentials",
    surface: "credential answers: container endpoint and IMDS JSON, credential_process output, "
        + "shared credentials and config files", run: runCredentials)
let signerTarget = FuzzTarget(name: "signer", surface: "the signer's answer (status and JSON)", run: runSigner)
let notifyTarget = FuzzTarget(
    name: "notify", surface: "PostgreSQL NOTIFY payloads (the fleet's change messages) into the scheduler", run: runNotify)
let rowTarget = FuzzTarget(
    name: "row", surface: "stored rows: a task's columns (then shown and planned), sessions, webhooks, events, attempts",
    run: runRow)
let dbusTarget = FuzzTarget(
    name: "dbus", surface: "NetworkManager and ModemManager property values of any type, into the network view",
    run: runDBus)

/// Each line a value; the first word of the line says which reader gets it.
func runHeaders(_ input: FuzzInput) {
    for line in input.text.lines {
        let pair = line.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: false)
        let value = pair.count > 1 ? String(pair[1]) : ""
        switch pair[0] {
        case "retry-after": _ = RetryAfter.parse(value, now: 1_800_000_000)
        case "location":
            let resolved = TusUpload.resolve(value, against: "http://127.0.0.1:1080/files")
            _ = URLParts(resolved)
        case "url":
            if let parts = URLParts(value) { _ = (parts.scheme, parts.host, parts.port) }
            _ = S3Upload.listingURL(objectURL: value)
        case "content-range":
            _ = ContentRange(value)
            _ = ChunkedUpload.acknowledgedEnd(value)
        case "etag":
            let head = ResponseHead(status: 200, headers: ["etag": value, "last-modified": value])
            if let validator = DownloadMachine.validator(of: head) {
                _ = DownloadMachine.sameValidator(validator, head)
                _ = DownloadMachine.validatorValue(validator)
            }
        case "integer": _ = IETFUpload.integer(value)
        case "boolean": _ = IETFUpload.boolean(value)
        case "options":
            _ = ProtocolSelection.choose(
                ResponseHead(
                    status: 200, headers: ["tus-version": value, "tus-resumable": value, "upload-draft-interop-version": value]))
        case "expiry":
            _ = CredentialExpiry.says(ResponseHead(status: 400, headers: ["www-authenticate": value], body: Array(value.utf8)))
        case "route":
            _ = NetworkClassifier.defaultInterface(routeTable: input.text)
        default:
            try? HeaderRules.validate(name: String(pair[0]), value: value, field: "headers")
        }
    }
}

func runXML(_ input: FuzzInput) {
    for tag in ["UploadId", "ETag", "PartNumber", "Size", "Code", "Message", "Part", "Upload", "Key", "IsTruncated"] {
        _ = XMLText.first(tag, in: input.bytes)
        for block in XMLText.blocks(tag, in: input.bytes).prefix(100) { _ = XMLText.unescape(block) }
    }
    let parts = XMLText.blocks("Part", in: input.bytes).prefix(1000).map { $0 }
    _ = S3Upload.contiguousParts(Array(parts), partSize: 5 << 20)
    _ = S3Upload.unescape(input.text)
}

/// Sections: a container endpoint or IMDS answer, a `credential_process` output, a shared
/// credentials file, a config file.
func runCredentials(_ input: FuzzInput) {
    if let json = try? JSON.parse(Array(input.section(0).utf8), maxDepth: 8),
        let keys = AWSCredentials.fromContainerAnswer(json)
    {
        _ = (keys.due(now: 1_800_000_000), keys.valid(now: 1_800_000_000))
    }
    if let json = try? JSON.parse(Array(input.section(1).utf8), maxDepth: 8),
        let keys = AWSCredentials.fromProcessOutput(json)
    {
        _ = (keys.due(now: 0), keys.valid(now: 0))
    }
    for (index, config) in [false, true].enumerated() {
        let text = input.section(2 + index)
        for name in ["default", "fuzz"] {
            if let profile = AWSSharedFiles.profile(name, in: text, config: config) { _ = AWSSharedFiles.keys(profile) }
        }
    }
}

/// The status on the first line, then the signer's body.
func runSigner(_ input: FuzzInput) {
    let lines = input.text.lines
    let status = Int(lines.first ?? "") ?? 200
    let body = Array(lines.dropFirst().joined(separator: "\n").utf8)
    let outcome = SignerOutcome.decide(status: status, json: try? JSON.parse(body, maxDepth: 16))
    guard case .signed(let signature) = outcome else { return }
    _ = signature.usable(at: 1_800_000_000)
    let request = PlannedRequest(
        method: "PUT", url: "http://127.0.0.1:9/x", headers: [("A", "b")], body: .file(offset: 0, length: 1))
    _ = signature.applied(to: request)
}

/// A payload as `LISTEN` hands it over; what it decodes to is queued in a scheduler.
func runNotify(_ input: FuzzInput) {
    for runsShared in [false, true] {
        guard let changes = ChangeMessage.decode(input.text, node: "node-a", runsShared: runsShared) else { continue }
        var scheduler = Scheduler()
        for entry in changes.queued.prefix(1000) { scheduler.enqueue(entry) }
        for sequence in changes.unqueued.prefix(1000) { scheduler.dequeue(sequence) }
        while let next = scheduler.next() {
            scheduler.started(next.key)
            scheduler.dequeue(next.sequence)
        }
        _ = scheduler.saturatedKeys()
    }
}

/// A stored row: one column a line (`NULL` for SQL NULL); numbers read as SQLite and libpq give them.
struct FuzzRow: StoredRow {
    let columns: [String?]

    init(_ text: String) {
        columns = text.lines.map { $0 == "NULL" ? nil : $0 }
    }

    func column(_ index: Int32) -> String? { Int(index) < columns.count ? columns[Int(index)] : nil }
    func isNull(_ column: Int32) -> Bool { self.column(column) == nil }
    func int(_ column: Int32) -> Int64 { optionalInt(column) ?? 0 }
    func optionalInt(_ column: Int32) -> Int64? { self.column(column).map { Int64($0) ?? 0 } }
    func double(_ column: Int32) -> Double { optionalDouble(column) ?? 0 }
    func optionalDouble(_ column: Int32) -> Double? { self.column(column).map { Double($0) ?? 0 } }
    func string(_ column: Int32) -> String { self.column(column) ?? "" }
    func optionalString(_ column: Int32) -> String? { self.column(column) }
}

/// The first line picks the table (task, session, webhook, delivery, event, attempt, cleanup).
func runRow(_ input: FuzzInput) {
    let lines = input.text.lines
    let row = FuzzRow(lines.dropFirst().joined(separator: "\n"))
    switch lines.first ?? "" {
    case "session": _ = try? StoreRules.decodeSession(row)
    case "webhook": _ = try? StoreRules.decodeWebhook(row)
    case "delivery": _ = StoreRules.decodeDelivery(row)
    case "event": _ = StoreRules.decodeEvent(row)
    case "attempt": _ = try? StoreRules.decodeAttempt(row, taskID: "t")
    case "cleanup": _ = StoreRules.decodeCleanup(row)
    default:
        guard let task = try? TaskRows.decode(row) else { return }
        _ = task.jsonText()
        _ = task.jsonText(live: LiveProgress(bytesTransferred: task.bytesTransferred, bytesPerSecond: 1e6))
        var machine = TransferMachines.machine(for: task, headers: HeaderRules.merged([], task.request.headers))
        checkPlan(machine.start(now: 0), total: task.file.size, protocolName: "row")
        _ = machine.cancellation
    }
}

/// Property maps of the manager, the active connection, its devices and the modem, each value of
/// any D-Bus type the bytes make, read as the watcher reads them.
func runDBus(_ input: FuzzInput) {
    var bytes = input.bytes[...]
    func value(_ depth: Int = 0) -> BusValue {
        let kind = bytes.popFirst() ?? 0
        func word() -> UInt32 { (0..<4).reduce(UInt32(0)) { value, _ in value << 8 | UInt32(bytes.popFirst() ?? 0) } }
        func text() -> String {
            let count = Int(bytes.popFirst() ?? 0) % 48
            let taken = bytes.prefix(count)
            bytes = bytes.dropFirst(count)
            return String(decoding: taken, as: UTF8.self)
        }
        switch kind % 7 {
        case 0: return .uint32(word())
        case 1: return .int32(Int32(bitPattern: word()))
        case 2: return .bool(word() & 1 == 1)
        case 3: return .string(text())
        case 4: return .objectPath(["/", "/org/freedesktop/ModemManager1/Modem/0", "/x/" + text()][Int(word() % 3)])
        case 5 where depth < 3: return .array((0..<Int(word() % 5)).map { _ in value(depth + 1) })
        default: return .unsupported(text())
        }
    }
    func properties(_ names: [String]) -> [String: BusValue] {
        var map: [String: BusValue] = [:]
        for name in names where (bytes.popFirst() ?? 0) & 3 != 0 { map[name] = value() }
        return map
    }
    let manager = properties(["Connectivity", "Metered", "PrimaryConnection", "ActiveConnections", "PrimaryConnectionType"])
    let connection = properties(["Type", "Devices"])
    let devices = (0..<3).map { _ in properties(["DeviceType", "Interface", "Metered", "Udi"]) }
    let modem = properties(["AccessTechnologies"])
    let threeGPP = properties(["RegistrationState"])
    var missing = MissingProperties(logger: Logger(label: "fuzz", factory: { _ in SwiftLogNoOpLogHandler() }))
    let reading = NetworkManagerWatcher.reading(
        manager: manager, connection: { _ in connection }, device: { devices[$0.utf8.count % devices.count] },
        modem: { _ in (modem, threeGPP) }, missing: &missing)
    _ = reading.network(classifier: NetworkClassifier())
}
