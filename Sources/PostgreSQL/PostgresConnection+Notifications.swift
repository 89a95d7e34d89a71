internal import CLibPQ
import Glibc

/// A notification (`NOTIFY channel, 'payload'`) received on a channel this connection listens to.
public struct PostgresNotification: Sendable, Equatable {
    public var channel: String
    public var payload: String
    /// The process id of the server backend that sent it.
    public var senderPID: Int32
}

/// `LISTEN` and `NOTIFY`: what the fleet's nodes tell one another (docs/fleet.md).
extension PostgresConnection {
    /// Subscribes this connection to `channel` (`LISTEN`).
    public func listen(_ channel: String) throws(PostgresError) {
        try execute("LISTEN " + quotedIdentifier(channel))
    }

    /// Sends `payload` to every connection listening on `channel`, when the transaction it is in
    /// commits (`pg_notify`).
    public func notify(_ channel: String, payload: String) throws(PostgresError) {
        try execute("SELECT pg_notify($1, $2)", [.text(channel), .text(payload)])
    }

    /// The notifications received, waiting up to `seconds` for the first when none is there yet.
    /// Returns early with none when the wait ends; throws when the connection broke.
    public func notifications(waitingUpTo seconds: Double) throws(PostgresError) -> [PostgresNotification] {
        var received = try takeNotifications()
        guard received.isEmpty, seconds > 0 else { return received }
        var descriptor = pollfd(fd: PQsocket(raw), events: Int16(POLLIN), revents: 0)
        guard descriptor.fd >= 0 else {
            throw PostgresError(kind: .connection, message: "the connection has no socket: \(Self.trimmed(PQerrorMessage(raw)))")
        }
        let ready = poll(&descriptor, 1, Int32(min(seconds, 3600) * 1000))
        if ready > 0 { received = try takeNotifications() }
        return received
    }

    private func takeNotifications() throws(PostgresError) -> [PostgresNotification] {
        guard PQconsumeInput(raw) == 1 else {
            throw PostgresError(kind: .connection, message: Self.trimmed(PQerrorMessage(raw)))
        }
        var received: [PostgresNotification] = []
        while let notice = PQnotifies(raw) {
            received.append(
                PostgresNotification(
                    channel: String(cString: notice.pointee.relname), payload: String(cString: notice.pointee.extra),
                    senderPID: notice.pointee.be_pid))
            PQfreemem(notice)
        }
        return received
    }

    /// An identifier quoted for SQL (`PQescapeIdentifier`), for the few statements that take no
    /// parameters in its place (`LISTEN`).
    public func quotedIdentifier(_ name: String) throws(PostgresError) -> String {
        guard let escaped = PQescapeIdentifier(raw, name, name.utf8.count) else {
            throw PostgresError(kind: .statement, message: Self.trimmed(PQerrorMessage(raw)))
        }
        defer { PQfreemem(escaped) }
        return String(cString: escaped)
    }
}
