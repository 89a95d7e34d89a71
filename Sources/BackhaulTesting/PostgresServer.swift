import Foundation
import Glibc
import PostgreSQL

/// A PostgreSQL server of the test's own: `initdb` and `pg_ctl` in a temporary directory, listening
/// on 127.0.0.1 with password authentication (scram-sha-256) for the role `backhaul`, which owns
/// the database `backhaul`. PostgreSQL refuses to run as root, so as root the server runs as the
/// `postgres` user (`runuser`), in a directory that user owns. Stopped and removed with the value,
/// and by a watchdog when this process ends without releasing it (a shared instance, an exit, a
/// crash): no server outlives the tests that started it.
public final class PostgresServer {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public let port: UInt16
    public let password: String
    /// The data, the socket, the log and the programs' output; removed after the server stopped
    /// (a stored property is released after `deinit` ran).
    private let scratch = TemporaryDirectory("backhaul-pg")
    public var directory: String { scratch.path }
    private let binaries: String
    private var running = false
    /// The write end of the watchdog's pipe, held by this process alone (close-on-exec): when it
    /// closes, by `deinit` or by the process's end however it comes, the watchdog reads the end of
    /// its input and stops the server.
    private var lifeline: Int32 = -1
    private var watchdog: pid_t = 0

    /// The database's URL, as `--state` takes it.
    public var url: String { "postgres://backhaul:\(password)@127.0.0.1:\(port)/backhaul" }
    /// The server's log.
    public var log: String { directory + "/server.log" }

    /// The newest installed server's programs (`/usr/lib/postgresql/N/bin`), nil when there is none.
    public static var binaries: String? {
        let root = "/usr/lib/postgresql"
        let versions = (try? FileManager.default.contentsOfDirectory(atPath: root))?.compactMap(Int.init).sorted() ?? []
        return versions.last.map { "\(root)/\($0)/bin" }.flatMap {
            FileManager.default.isExecutableFile(atPath: $0 + "/pg_ctl") ? $0 : nil
        }
    }

    public init() throws {
        guard let binaries = Self.binaries else {
            throw Failure(description: "PostgreSQL is not installed: run `make test-deps`")
        }
        self.binaries = binaries
        port = try freePort()
        password = "pw-" + UUID().uuidString.lowercased()
        try password.write(toFile: directory + "/password", atomically: true, encoding: .utf8)
        if getuid() == 0 {
            guard let user = getpwnam("postgres") else { throw Failure(description: "as root, the `postgres` user is needed") }
            for path in [directory, directory + "/password"] { chown(path, user.pointee.pw_uid, user.pointee.pw_gid) }
        }
        try startWatchdog()
        try run(
            "initdb", "-D", directory + "/data", "-U", "backhaul", "--auth-local=trust", "--auth-host=scram-sha-256",
            "--pwfile=" + directory + "/password", "-E", "UTF8", "--no-sync", "--no-instructions")
        try start()
        let setup = try PostgresConnection("postgres://backhaul:\(password)@127.0.0.1:\(port)/postgres")
        try setup.execute("CREATE DATABASE backhaul")
    }

    deinit {
        if running { try? run("pg_ctl", "-D", directory + "/data", "-m", "immediate", "-w", "-t", "20", "stop") }
        guard watchdog > 0 else { return }
        close(lifeline)
        var status: Int32 = 0
        _ = eventually(timeout: 20, interval: 0.02) { waitpid(watchdog, &status, WNOHANG) == watchdog }
    }

    /// Starts the watchdog: a shell in a session of its own (a signal to the tests' process group
    /// does not reach it) that waits for the end of its input, the lifeline, then stops the
    /// server at once and removes its directory.
    private func startWatchdog() throws {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { throw Failure(description: "pipe: errno \(errno)") }
        for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        defer { close(ends[0]) }
        lifeline = ends[1]
        let script = "cat >/dev/null; \"$1\" -D \"$0/data\" -m immediate -w -t 20 stop; rm -rf \"$0\""
        watchdog = try spawn(["/bin/sh", "-c", script, directory, binaries + "/pg_ctl"], input: ends[0], detached: true)
    }

    /// Starts the server and waits until it takes connections.
    public func start() throws {
        try run(
            "pg_ctl", "-D", directory + "/data", "-l", log, "-w", "-t", "30", "-o",
            "-p \(port) -k \(directory) -c listen_addresses=127.0.0.1", "start")
        running = true
    }

    /// Stops the server: `fast` ends every session and shuts down cleanly, `immediate` quits at
    /// once, as a crash would (the next start recovers from the WAL).
    public func stop(immediate: Bool = false) throws {
        try run("pg_ctl", "-D", directory + "/data", "-m", immediate ? "immediate" : "fast", "-w", "-t", "30", "stop")
        running = false
    }

    /// Runs one of the server's programs (as `postgres` when this process is root) in the
    /// server's directory, at most 60 s, its output in `<program>.out` there.
    ///
    /// Spawned and waited for directly, not through Foundation's `Process`, which learns of a
    /// child's end from a socket the child inherits: `pg_ctl start` leaves the server running
    /// with that socket, so the end of `pg_ctl` would never be seen.
    private func run(_ program: String, _ arguments: String...) throws {
        let command = [binaries + "/" + program] + arguments
        let outputPath = directory + "/\(program).out"
        let pid = try spawn(["/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", directory] + command, output: outputPath)
        var status: Int32 = 0
        let ended = eventually(timeout: 60, interval: 0.02) { waitpid(pid, &status, WNOHANG) == pid }
        if !ended {
            kill(pid, SIGKILL)
            waitpid(pid, &status, 0)
        }
        guard ended, status == 0 else {
            let text = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
            throw Failure(description: "\(program) failed (wait status \(status)): \(text)")
        }
    }

    /// Spawns `argv` (as `postgres` when this process is root): its output to `output` (else
    /// nowhere), its input from `input` (else nothing), in a session of its own when `detached`.
    private func spawn(_ argv: [String], output: String = "/dev/null", input: Int32? = nil, detached: Bool = false) throws
        -> pid_t
    {
        let argv = (getuid() == 0 ? ["/usr/sbin/runuser", "-u", "postgres", "--"] : []) + argv
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        if let input {
            posix_spawn_file_actions_adddup2(&actions, input, 0)
        } else {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        }
        posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // POSIX_SPAWN_SETSID (glibc's value; Swift's Glibc module leaves the GNU flags out).
        if detached { posix_spawnattr_setflags(&attributes, 0x80) }
        let strings = argv.map { strdup($0) }
        defer { for string in strings { free(string) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, argv[0], &actions, &attributes, strings + [nil], environ)
        guard spawned == 0 else { throw Failure(description: "\(argv[0]) could not start: errno \(spawned)") }
        return pid
    }
}
