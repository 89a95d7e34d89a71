import BackhaulCore
import BackhaulQueue
import JSONCodec

/// What a commit changed, as the other nodes hear it (`NOTIFY`'s payload is at most 8,000 bytes,
/// so a long list of queued tasks goes in several). The tasks created are not sent: a node reads
/// a task it starts.
enum ChangeMessage {
    static let entriesPerMessage = 40

    static func encode(_ changes: StoreChanges, pins: [Int64: String], node: String) -> [String] {
        var head: JSONObject = [:]
        if !changes.unqueued.isEmpty { head["u"] = .array(changes.unqueued.map { .int($0) }) }
        if !changes.leftRunning.isEmpty { head["r"] = .array(changes.leftRunning.map { .string($0) }) }
        if let timer = changes.earliestTimer { head["t"] = .double(timer) }
        if changes.eventsAppended { head["e"] = .bool(true) }
        if changes.deliveriesAdded { head["d"] = .bool(true) }
        if changes.cleanupsAdded { head["c"] = .bool(true) }
        if changes.policyReview { head["p"] = .bool(true) }
        if !changes.sessions.isEmpty { head["s"] = .array(changes.sessions.sorted().map { .string($0) }) }
        if !changes.settings.isEmpty { head["g"] = .array(changes.settings.sorted().map { .string($0) }) }
        if changes.pruned > 0 { head["x"] = .int(Int64(changes.pruned)) }
        if !changes.touched.isEmpty { head["h"] = .array(changes.touched.map { .int($0) }) }
        let entries = changes.queued.map { entry -> JSON in
            .array([
                .int(entry.sequence), .double(entry.priority), .string(entry.key.session), .string(entry.key.host),
                entry.limit.map { .int(Int64($0)) } ?? .null, pins[entry.sequence].map { .string($0) } ?? .null,
            ])
        }
        // Oversized lists (a batch touching thousands of tasks at once) are not spelled out: the
        // other nodes read everything again, as after a lost `LISTEN`.
        if !head.isEmpty, JSON.object(head).serialized().utf8.count > 7000 { head = ["reload": .bool(true)] }
        var messages: [String] = []
        var start = 0
        repeat {
            var message = messages.isEmpty ? head : [:]
            let end = min(start + entriesPerMessage, entries.count)
            if start < end { message["q"] = .array(Array(entries[start..<end])) }
            // The sender first, on a line of its own: a node skips its own messages unparsed.
            messages.append(node + "\n" + JSON.object(message).serialized())
            start = end
        } while start < entries.count
        return messages
    }

    /// The changes another node announced, as this node's observers take them: nil for this
    /// node's own (its observers heard them at the commit). Queued tasks pinned to another node
    /// are left out, and so are unpinned ones unless this node `runsShared` (sees the shared roots).
    static func decode(_ payload: String, node: String, runsShared: Bool) -> StoreChanges? {
        guard let newline = payload.utf8.firstIndex(of: UInt8(ascii: "\n")),
            payload[..<newline] != node,
            let message = try? JSON.parse(String(payload[payload.index(after: newline)...]), maxDepth: 8)
        else { return nil }
        var changes = StoreChanges()
        for entry in message["q"]?.arrayValue ?? [] {
            guard let fields = entry.arrayValue, fields.count == 6, let sequence = fields[0].intValue,
                let priority = fields[1].doubleValue, let session = fields[2].stringValue, let host = fields[3].stringValue
            else { continue }
            let pin = fields[5].stringValue
            guard pin == node || (pin == nil && runsShared) else { continue }
            changes.queued.append(
                Scheduler.Entry(
                    sequence: sequence, priority: priority, key: Scheduler.Key(session: session, host: host),
                    limit: fields[4].intValue.map { Int($0) }))
        }
        changes.unqueued = message["u"]?.arrayValue?.compactMap(\.intValue) ?? []
        changes.leftRunning = message["r"]?.arrayValue?.compactMap(\.stringValue) ?? []
        changes.earliestTimer = message["t"]?.doubleValue
        changes.eventsAppended = message["e"] == .bool(true)
        changes.deliveriesAdded = message["d"] == .bool(true)
        changes.cleanupsAdded = message["c"] == .bool(true)
        changes.policyReview = message["p"] == .bool(true)
        changes.sessions = Set(message["s"]?.arrayValue?.compactMap(\.stringValue) ?? [])
        changes.settings = Set(message["g"]?.arrayValue?.compactMap(\.stringValue) ?? [])
        changes.pruned = Int(message["x"]?.intValue ?? 0)
        changes.touched = message["h"]?.arrayValue?.compactMap(\.intValue) ?? []
        if message["reload"] == .bool(true) { changes.readEverything() }
        return changes
    }
}
