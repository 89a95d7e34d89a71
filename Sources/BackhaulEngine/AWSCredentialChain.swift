import BackhaulCore
import Curl
import Glibc
import JSONCodec
import Synchronization
import Threads

/// Why no AWS credentials could be had. The message names sources and files, never a secret.
public struct AWSCredentialError: Error, Sendable, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// The standard AWS credential chain (docs/credentials.md), for `s3` tasks that give a region only,
/// in the AWS SDKs' order:
///
/// 1. `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (/ `AWS_SESSION_TOKEN`);
/// 2. web identity: `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN` (+ `AWS_ROLE_SESSION_NAME`),
///    traded at STS (`AssumeRoleWithWebIdentity`) for temporary keys; the file is read again at
///    each renewal (Kubernetes rotates it);
/// 3. the shared credentials and config files (`AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`,
///    default `~/.aws/credentials` and `~/.aws/config`) for `AWS_PROFILE` (default `default`):
///    static keys, or the JSON a `credential_process` prints;
/// 4. the container endpoint (`AWS_CONTAINER_CREDENTIALS_FULL_URI`, or `_RELATIVE_URI` on
///    169.254.170.2), with `Authorization` from `AWS_CONTAINER_AUTHORIZATION_TOKEN` or the file
///    `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` names (ECS, EKS Pod Identity);
/// 5. IMDSv2, when `--aws-imds` is set (at `AWS_EC2_METADATA_SERVICE_ENDPOINT` when that is set).
///
/// The first source that is set up answers. Lookups run on the chain's own thread
/// (`bh-credentials`), never on the caller's: `keys()` answers at once with what is kept, and
/// what to look up when is `CredentialRefresh`'s (renewal 5 minutes before `Expiration`, a
/// backoff after a failure). Each network request is bounded by `timeoutSeconds`, a process by
/// `processTimeoutSeconds` and `processOutputLimit`. `onChange` hears of each lookup's end.
public final class AWSCredentialChain: Sendable {
    private let environment: [String: String]
    private let imds: Bool
    private let imdsEndpoint: String
    private let clock: any Clock
    private struct State {
        var refresh = CredentialRefresh()
        var stopped = false
        var started = false
        /// Bumped to wake the thread before its time (a task asked, keys were invalidated).
        var pokes = 0
        var listener: (@Sendable () -> Void)?
        /// The source the last lookup asked last (nil until one named it).
        var source: AWSCredentialSource?
    }
    private let state = Locked(State())
    private let renewals = Atomic<Int>(0)
    private let thread = WorkerThread(name: "bh-credentials")
    static let timeoutSeconds = 5
    static let processTimeoutSeconds: Double = 30
    /// The most a `credential_process` may print; past it the process is killed.
    static let processOutputLimit = 1 << 20

    public init(
        environment: [String: String], imds: Bool = false, imdsEndpoint: String = "http://169.254.169.254",
        clock: any Clock = SystemClock()
    ) {
        self.environment = environment
        self.imds = imds
        self.imdsEndpoint = imdsEndpoint
        self.clock = clock
    }

    /// How many lookups gave keys (for logs and tests).
    public var resolutions: Int { renewals.load(ordering: .relaxed) }

    /// The source the chain asks (or asked last): what a task waiting for keys waits for.
    public var source: AWSCredentialSource? { state.withLock { $0.source } }

    /// Notes the source a lookup is about to ask.
    private func asking(_ source: AWSCredentialSource) { state.withLock { $0.source = source } }

    /// Why the last lookup failed, while no lookup has succeeded since.
    public var lastError: String? { state.withLock { $0.refresh.lastError } }

    /// Calls `listener` (on the chain's thread) after each lookup, keys or not.
    public func onChange(_ listener: @escaping @Sendable () -> Void) { state.withLock { $0.listener = listener } }

    /// Keys to sign with now, or nil when there are none yet: a lookup is then under way (or
    /// waits out its backoff) on the chain's thread. Never blocks on a source.
    public func keys() -> AWSCredentials? {
        let now = clock.now()
        let (keys, startThread) = state.withLockNotifyingAll { state -> (AWSCredentials?, Bool) in
            let keys = state.refresh.ask(now: now)
            state.pokes += 1
            let start = !state.started && !state.stopped
            state.started = true
            return (keys, start)
        }
        if startThread { thread.start { [self] in run() } }
        return keys
    }

    /// Keys to sign with now, or why there are none: for a request that cannot wait (a
    /// transfer's next request, a cleanup).
    public func credentials() throws(AWSCredentialError) -> AWSCredentials {
        if let keys = keys() { return keys }
        throw AWSCredentialError(
            "the AWS credentials are not there yet" + (lastError.map { ": \($0)" } ?? ": the chain is asking its source"))
    }

    /// Forgets the kept keys: the server said they expired. New ones are asked for at once.
    public func invalidate() {
        state.withLockNotifyingAll {
            $0.refresh.invalidate()
            $0.pokes += 1
        }
    }

    /// Ends the chain's thread (a lookup under way finishes within its bounds first).
    public func stop() {
        let started = state.withLockNotifyingAll { state -> Bool in
            state.stopped = true
            return state.started
        }
        if started { thread.detach() }
    }

    /// The chain's thread: sleeps until a lookup is due (or it is poked), runs it, says so.
    private func run() {
        var seen = -1
        while true {
            let due = state.withLock { state -> Bool? in
                if state.stopped { return nil }
                let due = state.refresh.nextLookup().map { $0 <= clock.now() } ?? false
                if due { state.refresh.begin() }
                return due
            }
            guard let due else { return }
            guard due else {
                let wait = state.withLock { $0.refresh.nextLookup() }.map { max(0.01, min(60, $0 - clock.now())) } ?? 60
                seen = state.wait(until: { $0.stopped || $0.pokes != seen }, timeout: wait) { $0.pokes }
                continue
            }
            let outcome = Result { () throws(AWSCredentialError) in try resolve() }
            let listener = state.withLock { state -> (@Sendable () -> Void)? in
                switch outcome {
                case .success(let keys): state.refresh.succeeded(keys, now: clock.now())
                case .failure(let error): state.refresh.failed(error.description, now: clock.now())
                }
                return state.listener
            }
            if case .success = outcome { renewals.add(1, ordering: .relaxed) }
            listener?()
        }
    }

    private func variable(_ name: String) -> String? {
        guard let value = environment[name], !value.isEmpty else { return nil }
        return value
    }

    /// One lookup, through the sources in order; blocks (on the chain's thread) within the bounds.
    func resolve() throws(AWSCredentialError) -> AWSCredentials {
        if let key = variable("AWS_ACCESS_KEY_ID"), let secret = variable("AWS_SECRET_ACCESS_KEY") {
            return AWSCredentials(accessKeyID: key, secretAccessKey: secret, sessionToken: variable("AWS_SESSION_TOKEN"))
        }
        if let web = try fromWebIdentity() { return web }
        if let shared = try fromSharedFiles() { return shared }
        if let container = try fromContainerEndpoint() { return container }
        if imds { return try fromIMDS() }
        throw AWSCredentialError(
            "no AWS credentials: none in the environment, web identity, the shared files, or a container endpoint"
                + (imds ? "" : " (IMDS is off: --aws-imds)"))
    }

    private func fromWebIdentity() throws(AWSCredentialError) -> AWSCredentials? {
        guard let file = variable("AWS_WEB_IDENTITY_TOKEN_FILE"), let role = variable("AWS_ROLE_ARN") else { return nil }
        guard let token = Self.read(file)?.trimmed(), !token.isEmpty else {
            throw AWSCredentialError("cannot read the web identity token file \(file)")
        }
        asking(.webIdentity)
        let session = variable("AWS_ROLE_SESSION_NAME") ?? "backhauld-\(Int64(clock.now()))"
        let answer = try Self.get(
            "POST", AWSWebIdentity.endpoint(variable), headers: ["Content-Type: application/x-www-form-urlencoded"],
            body: AWSWebIdentity.requestBody(roleARN: role, sessionName: session, token: token),
            source: "STS (web identity)")
        guard let keys = AWSWebIdentity.credentials(fromAnswer: answer) else {
            throw AWSCredentialError("STS answered AssumeRoleWithWebIdentity with no credentials")
        }
        return keys
    }

    private func fromSharedFiles() throws(AWSCredentialError) -> AWSCredentials? {
        let home = variable("HOME") ?? "/root"
        let profileName = variable("AWS_PROFILE") ?? "default"
        let files = [
            (variable("AWS_SHARED_CREDENTIALS_FILE") ?? home + "/.aws/credentials", false),
            (variable("AWS_CONFIG_FILE") ?? home + "/.aws/config", true),
        ]
        for (path, isConfig) in files {
            guard let text = Self.read(path), let profile = AWSSharedFiles.profile(profileName, in: text, config: isConfig) else {
                continue
            }
            if let keys = AWSSharedFiles.keys(profile) { return keys }
            if let command = profile["credential_process"], !command.isEmpty {
                asking(.process)
                let output = try Self.run(command)
                guard let parsed = try? JSON.parse(output, maxDepth: 8), let keys = AWSCredentials.fromProcessOutput(parsed)
                else {
                    throw AWSCredentialError("the credential_process of profile \(profileName) printed no Version 1 credentials")
                }
                return keys
            }
        }
        return nil
    }

    private func fromContainerEndpoint() throws(AWSCredentialError) -> AWSCredentials? {
        let url: String
        if let full = variable("AWS_CONTAINER_CREDENTIALS_FULL_URI") {
            url = full
        } else if let relative = variable("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
            url = "http://169.254.170.2" + relative
        } else {
            return nil
        }
        asking(.container)
        var headers: [String] = []
        if let token = variable("AWS_CONTAINER_AUTHORIZATION_TOKEN") {
            headers.append("Authorization: \(token)")
        } else if let file = variable("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
            guard let token = Self.read(file)?.trimmed(), !token.isEmpty else {
                throw AWSCredentialError("cannot read the container authorization token file \(file)")
            }
            headers.append("Authorization: \(token)")
        }
        let answer = try Self.get("GET", url, headers: headers, source: "the container credentials endpoint")
        guard let parsed = try? JSON.parse(answer, maxDepth: 8), let keys = AWSCredentials.fromContainerAnswer(parsed) else {
            throw AWSCredentialError("the container credentials endpoint answered no credentials")
        }
        return keys
    }

    /// IMDSv2 at `AWS_EC2_METADATA_SERVICE_ENDPOINT` (the SDKs' setting), else 169.254.169.254.
    private func fromIMDS() throws(AWSCredentialError) -> AWSCredentials {
        asking(.imds)
        let imdsEndpoint =
            variable("AWS_EC2_METADATA_SERVICE_ENDPOINT").map { $0.hasSuffix("/") ? String($0.dropLast()) : $0 } ?? imdsEndpoint
        let token = try Self.get(
            "PUT", imdsEndpoint + "/latest/api/token", headers: ["X-aws-ec2-metadata-token-ttl-seconds: 21600"], body: [],
            source: "IMDS")
        let header = "X-aws-ec2-metadata-token: \(String(decoding: token, as: UTF8.self).trimmed())"
        let base = imdsEndpoint + "/latest/meta-data/iam/security-credentials/"
        let roles = try Self.get("GET", base, headers: [header], source: "IMDS")
        guard let role = String(decoding: roles, as: UTF8.self).split(whereSeparator: \.isNewline).first.map(String.init),
            !role.isEmpty
        else { throw AWSCredentialError("IMDS names no instance role") }
        let answer = try Self.get("GET", base + role, headers: [header], source: "IMDS")
        guard let parsed = try? JSON.parse(answer, maxDepth: 8), let keys = AWSCredentials.fromContainerAnswer(parsed) else {
            throw AWSCredentialError("IMDS answered no credentials for its role")
        }
        return keys
    }

    private static func get(
        _ method: String, _ url: String, headers: [String], body: [UInt8]? = nil, source: String
    ) throws(AWSCredentialError) -> [UInt8] {
        let exchange: HTTPExchange
        do {
            exchange = try HTTPClient().send(method, url, headers: headers, body: body, timeoutSeconds: timeoutSeconds)
        } catch {
            throw AWSCredentialError("\(source) cannot be reached: \(error.message)")
        }
        guard (200..<300).contains(exchange.status) else { throw AWSCredentialError("\(source) answered \(exchange.status)") }
        return exchange.body
    }

    private static func read(_ path: String) -> String? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        while bytes.count < 1 << 20 {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            bytes += buffer[0..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Runs `command` with `/bin/sh -c` (in a process group of its own) and returns what it
    /// printed; its stderr is discarded (it may hold anything). Its output is read as it comes,
    /// while it runs: a process past `processTimeoutSeconds`, or that prints more than
    /// `processOutputLimit`, is killed with its group, and the lookup fails. A non-zero exit fails.
    static func run(_ command: String, timeout: Double = processTimeoutSeconds) throws(AWSCredentialError) -> [UInt8] {
        var pipes: [Int32] = [0, 0]
        guard pipe(&pipes) == 0 else { throw AWSCredentialError("cannot run the credential_process: no pipe") }
        // Neither end goes to other programs the daemon starts; the child gets the write end as
        // its stdout through dup2, which clears the flag on the copy.
        _ = fcntl(pipes[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(pipes[1], F_SETFD, FD_CLOEXEC)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, pipes[1], 1)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        // Nothing else of the daemon's goes to the process (its sockets, its state's files): a
        // process that outlives its lookup holds none of them open.
        _ = SpawnActions.closeFrom(&actions, 3)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP))
        posix_spawnattr_setpgroup(&attributes, 0)
        let arguments: [UnsafeMutablePointer<CChar>?] = ["/bin/sh", "-c", command].map { (text: String) in strdup(text) }
        defer { for argument in arguments { free(argument) } }
        var argv = arguments + [nil]
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, "/bin/sh", &actions, &attributes, &argv, environ)
        close(pipes[1])
        defer { close(pipes[0]) }
        guard spawned == 0 else { throw AWSCredentialError("cannot run the credential_process (errno \(spawned))") }
        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        let deadline = monotonicSeconds() + timeout
        var failure: String?
        while true {
            let left = deadline - monotonicSeconds()
            guard left > 0 else {
                failure = "the credential_process ran past \(Int(timeout)) s"
                break
            }
            var poller = pollfd(fd: pipes[0], events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, Int32(min(left, 1) * 1000) + 1) > 0 else { continue }
            let count = buffer.withUnsafeMutableBytes { Glibc.read(pipes[0], $0.baseAddress, $0.count) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { break }
            output += buffer[0..<count]
            if output.count > processOutputLimit {
                failure = "the credential_process printed more than \(processOutputLimit) bytes"
                break
            }
        }
        // The whole group: a shell's children too, which may hold the pipe open.
        if failure != nil { kill(-pid, SIGKILL) }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0, errno == EINTR {}
        if let failure { throw AWSCredentialError(failure) }
        // WIFEXITED and WEXITSTATUS are macros: exited normally with 0 is a status of 0.
        guard status == 0 else { throw AWSCredentialError("the credential_process failed (status \(status))") }
        return output
    }
}
