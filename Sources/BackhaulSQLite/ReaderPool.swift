import BackhaulQueue
import SQLite
import Threads

/// Read-only connections in WAL mode: API reads and the engine's lookups run here and never wait
/// for the writer (each read sees the last commit). A read takes a free connection, or waits
/// for one when all are busy.
final class ReaderPool: @unchecked Sendable {
    // @unchecked: each connection is used by one thread at a time, handed out under the lock.
    private let idle: Locked<[Connection]>

    init(path: String, count: Int) throws(SQLiteError) {
        var connections: [Connection] = []
        for _ in 0..<count {
            let connection = try Connection(path: path, readOnly: true)
            try connection.execute("PRAGMA temp_store = MEMORY")
            connections.append(connection)
        }
        idle = Locked(connections)
    }

    func read<T>(_ body: (Connection) throws -> T) rethrows -> T {
        let connection = idle.wait(until: { !$0.isEmpty }, timeout: 1e9) { $0.removeLast() }
        defer { idle.withLockNotifyingAll { $0.append(connection) } }
        return try body(connection)
    }
}
