import Foundation
import Glibc
import Threads

/// A TCP proxy between clients and a `PostgresServer`, on 127.0.0.1, that reads the frontend's
/// messages as they pass and, when armed, drops a connection right after it forwarded a `COMMIT`:
/// the server receives the `COMMIT` and commits, and the client never hears the answer (a lost
/// COMMIT, docs/fleet.md). Only the COMMIT of a transaction that ran a statement containing the
/// armed text counts, so that one writer's transaction is picked out among the others' (a
/// heartbeat's, a reader's).
public final class PostgresProxy: @unchecked Sendable {
    // @unchecked: the listener and each connection's thread own their descriptors; the shared
    // parts are behind `state`.
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public let port: UInt16
    private let upstreamPort: UInt16
    /// The server's URL through the proxy.
    public let url: String
    private let listener: Int32
    private let state = Locked<State>(State())
    private var acceptor: Thread?

    private struct State {
        /// Text a transaction's statement contains for its COMMIT to be dropped; how many more.
        var marker: String?
        var drops = 0
        /// COMMITs forwarded and then dropped so far.
        var dropped = 0
        var stopping = false
        var descriptors: Set<Int32> = []
    }

    /// Listens on a free port of 127.0.0.1 and forwards to `server`.
    public init(to server: PostgresServer) throws {
        upstreamPort = server.port
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard listener >= 0 else { throw Failure(description: "socket: errno \(errno)") }
        var yes: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = Self.loopback(port: 0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, Glibc.listen(listener, 64) == 0 else {
            close(listener)
            throw Failure(description: "bind or listen: errno \(errno)")
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        self.listener = listener
        port = UInt16(bigEndian: address.sin_port)
        url = server.url.replacing(":\(server.port)/", with: ":\(port)/") + "?sslmode=disable"
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "pg-proxy"
        acceptor = thread
        thread.start()
    }

    deinit { stop() }

    /// Drops the next `count` connections that forward a COMMIT of a transaction in which a
    /// statement contains `marker`, right after forwarding it.
    public func dropAfterCommit(containing marker: String, count: Int = 1) {
        state.withLock {
            $0.marker = marker
            $0.drops = count
        }
    }

    /// How many connections were dropped after a COMMIT.
    public var dropped: Int { state.withLock { $0.dropped } }

    /// Stops accepting and closes every connection.
    public func stop() {
        let descriptors = state.withLock { state -> Set<Int32> in
            guard !state.stopping else { return [] }
            state.stopping = true
            return state.descriptors
        }
        for descriptor in descriptors { shutdown(descriptor, Int32(SHUT_RDWR)) }
        shutdown(listener, Int32(SHUT_RDWR))
    }

    private static func loopback(port: UInt16) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return address
    }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            guard client >= 0 else {
                if errno == EINTR { continue }
                close(listener)
                return
            }
            let upstream = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = Self.loopback(port: upstreamPort)
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(upstream, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            let accepted = state.withLock { state -> Bool in
                guard !state.stopping, connected == 0 else { return false }
                state.descriptors.formUnion([client, upstream])
                return true
            }
            guard accepted else {
                close(client)
                close(upstream)
                continue
            }
            let thread = Thread { [self] in relay(client, upstream) }
            thread.name = "pg-proxy-conn"
            thread.start()
        }
    }

    /// One connection: bytes both ways; the client's read as messages (after its startup
    /// packets), each forwarded whole, so that a drop comes right after the message that asked
    /// for it.
    private func relay(_ client: Int32, _ upstream: Int32) {
        var parser = FrontendParser()
        var descriptors = [
            pollfd(fd: client, events: Int16(POLLIN), revents: 0), pollfd(fd: upstream, events: Int16(POLLIN), revents: 0),
        ]
        var buffer = [UInt8](repeating: 0, count: 65536)
        loop: while true {
            guard poll(&descriptors, 2, 1000) >= 0 || errno == EINTR else { break }
            if state.withLock({ $0.stopping }) { break }
            if descriptors[1].revents != 0 {
                let count = read(upstream, &buffer, buffer.count)
                guard count > 0, writeAll(client, buffer, count) else { break }
            }
            if descriptors[0].revents != 0 {
                let count = read(client, &buffer, buffer.count)
                guard count > 0 else { break }
                parser.append(buffer[0..<count])
                while let message = parser.next() {
                    guard writeAll(upstream, message.bytes, message.bytes.count) else { break loop }
                    if message.endsPipeline, shouldDrop(after: &parser) {
                        // The server reads the COMMIT, then the end of the stream; the client
                        // hears nothing more.
                        shutdown(upstream, Int32(SHUT_WR))
                        shutdown(client, Int32(SHUT_RDWR))
                        drain(upstream)
                        break loop
                    }
                }
            }
        }
        close(client)
        close(upstream)
        state.withLock { $0.descriptors.subtract([client, upstream]) }
    }

    /// Whether the connection goes now: a COMMIT was just sent (its pipeline synced) in a
    /// transaction that ran the armed text, and drops are left.
    private func shouldDrop(after parser: inout FrontendParser) -> Bool {
        defer { parser.committed = false }
        guard parser.committed else { return false }
        let marked = parser.transactionText
        parser.transactionText = ""
        return state.withLock { state in
            guard state.drops > 0, let marker = state.marker, marked.contains(marker) else { return false }
            state.drops -= 1
            state.dropped += 1
            return true
        }
    }

    /// Reads what the server still sends until it closes (at most 5 s), so that its answers do
    /// not make the close a reset that could cut the COMMIT off.
    private func drain(_ descriptor: Int32) {
        var buffer = [UInt8](repeating: 0, count: 65536)
        var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline, poll(&entry, 1, 100) >= 0 {
            if entry.revents != 0, read(descriptor, &buffer, buffer.count) <= 0 { return }
        }
    }

    private func writeAll(_ descriptor: Int32, _ bytes: [UInt8], _ count: Int) -> Bool {
        var offset = 0
        while offset < count {
            let written = bytes.withUnsafeBytes {
                send(descriptor, $0.baseAddress! + offset, count - offset, Int32(MSG_NOSIGNAL))
            }
            if written < 0, errno == EINTR { continue }
            guard written > 0 else { return false }
            offset += written
        }
        return true
    }
}

/// The frontend's side of the PostgreSQL protocol, as much as the proxy reads: the startup
/// packets (SSL and GSS requests, then the startup message, each a length and a body), then
/// typed messages (a type byte, a length). It notes the SQL of each Parse (and of each prepared
/// statement a Bind runs, by name) and a COMMIT among them.
struct FrontendParser {
    struct Message {
        var bytes: [UInt8]
        /// A Sync or a simple Query: the server answers what came before.
        var endsPipeline: Bool
    }

    private var pending: [UInt8] = []
    private var started = false
    private var statements: [String: String] = [:]
    /// The SQL the open transaction ran so far.
    var transactionText = ""
    /// A COMMIT was sent since the last Sync.
    var committed = false

    mutating func append(_ bytes: ArraySlice<UInt8>) { pending += bytes }

    mutating func next() -> Message? {
        let header = started ? 5 : 4
        guard pending.count >= header else { return nil }
        let lengthOffset = started ? 1 : 0
        let length = pending[lengthOffset..<lengthOffset + 4].reduce(0) { $0 << 8 | Int($1) }
        let total = lengthOffset + length
        guard total >= header, pending.count >= total else { return nil }
        let bytes = Array(pending[0..<total])
        pending.removeFirst(total)
        guard started else {
            // 80877103 asks for SSL, 80877104 for GSS encryption: the startup message comes next.
            let code = bytes[4..<8].reduce(0) { $0 << 8 | Int($1) }
            if code != 80_877_103, code != 80_877_104 { started = true }
            return Message(bytes: bytes, endsPipeline: false)
        }
        let body = Array(bytes[5...])
        switch bytes[0] {
        case UInt8(ascii: "P"):
            let fields = Self.strings(body, count: 2)
            if fields.count == 2 {
                if !fields[0].isEmpty { statements[fields[0]] = fields[1] }
                ran(fields[1])
            }
        case UInt8(ascii: "B"):
            let fields = Self.strings(body, count: 2)
            if fields.count == 2, !fields[1].isEmpty, let sql = statements[fields[1]] { ran(sql) }
        case UInt8(ascii: "Q"):
            if let sql = Self.strings(body, count: 1).first { ran(sql) }
            return Message(bytes: bytes, endsPipeline: true)
        case UInt8(ascii: "S"):
            return Message(bytes: bytes, endsPipeline: true)
        default: break
        }
        return Message(bytes: bytes, endsPipeline: false)
    }

    private mutating func ran(_ sql: String) {
        let statement = sql.trimmingCharacters(in: .whitespacesAndNewlines).uppercased()
        if statement.hasPrefix("BEGIN") || statement.hasPrefix("ROLLBACK") && !statement.hasPrefix("ROLLBACK TO") {
            transactionText = ""
        } else if statement.hasPrefix("COMMIT") {
            committed = true
        } else {
            transactionText += sql + "\n"
        }
    }

    /// The first `count` NUL-terminated strings of `body`.
    private static func strings(_ body: [UInt8], count: Int) -> [String] {
        var result: [String] = []
        var start = 0
        while result.count < count, let end = body[start...].firstIndex(of: 0) {
            result.append(String(decoding: body[start..<end], as: UTF8.self))
            start = end + 1
        }
        return result
    }
}
