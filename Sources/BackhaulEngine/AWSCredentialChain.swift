import BackhaulCore
import Curl
import Glibc
import JSONCodec
import Synchronization

/// Why no AWS credentials could be had. The message names sources and files, never a secret.
public struct AWSCredentialError: Error, Sendable, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// The standard AWS credential chain (docs/credentials.md), for `s3` tasks that give a region only:
///
/// 1. `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (/ `AWS_SESSION_TOKEN`);
/// 2. the shared credentials and config files (`AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`,
///    default `~/.aws/credentials` and `~/.aws/config`) for `AWS_PROFILE` (default `default`):
///    static keys, or the JSON a `credential_process` prints;
/// 3. the container endpoint (`AWS_CONTAINER_CREDENTIALS_FULL_URI`, or `_RELATIVE_URI` on
///    169.254.170.2), with `Authorization` from `AWS_CONTAINER_AUTHORIZATION_TOKEN` or the file
///    `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` names (ECS, EKS Pod Identity);
/// 4. IMDSv2, when `--aws-imds` is set.
///
/// The first source that gives keys wins. What it gave is kept and used until 5 minutes before
/// its `Expiration` (`AWSCredentials.renewalMargin`), then asked again; a failed renewal goes on
/// with the kept keys while they are valid. `invalidate` (after an `ExpiredToken`) forgets them.
/// Resolution blocks the calling thread, each network source for at most `timeoutSeconds` and a
/// process for at most `processTimeoutSeconds`.
public final class AWSCredentialChain: Sendable {
    private let environment: [String: String]
    private let imds: Bool
    private let imdsEndpoint: String
    private let clock: any Clock
    private let cached = Mutex<AWSCredentials?>(nil)
    private let renewals = Atomic<Int>(0)
    static let timeoutSeconds = 5
    static let processTimeoutSeconds: Double = 30

    public init(
        environment: [String: String], imds: Bool = false, imdsEndpoint: String = "http://169.254.169.254",
        clock: any Clock = SystemClock()
    ) {
        self.environment = environment
        self.imds = imds
        self.imdsEndpoint = imdsEndpoint
        self.clock = clock
    }

    /// How many times a source was asked (for logs and tests).
    public var resolutions: Int { renewals.load(ordering: .relaxed) }

    /// Keys to sign with now.
    public func credentials() throws(AWSCredentialError) -> AWSCredentials {
        let now = clock.now()
        let kept = cached.withLock { $0 }
        if let kept, !kept.due(now: now) { return kept }
        do {
            let fresh = try resolve()
            renewals.add(1, ordering: .relaxed)
            cached.withLock { $0 = fresh }
            return fresh
        } catch {
            if let kept, kept.valid(now: now) { return kept }
            throw error
        }
    }

    /// Forgets the kept keys: the server said they expired.
    public func invalidate() { cached.withLock { $0 = nil } }

    private func variable(_ name: String) -> String? {
        guard let value = environment[name], !value.isEmpty else { return nil }
        return value
    }

    func resolve() throws(AWSCredentialError) -> AWSCredentials {
        if let key = variable("AWS_ACCESS_KEY_ID"), let secret = variable("AWS_SECRET_ACCESS_KEY") {
            return AWSCredentials(accessKeyID: key, secretAccessKey: secret, sessionToken: variable("AWS_SESSION_TOKEN"))
        }
        if let shared = try fromSharedFiles() { return shared }
        if let container = try fromContainerEndpoint() { return container }
        if imds { return try fromIMDS() }
        throw AWSCredentialError(
            "no AWS credentials: none in the environment, the shared files, or a container endpoint"
                + (imds ? "" : " (IMDS is off: --aws-imds)"))
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

    private func fromIMDS() throws(AWSCredentialError) -> AWSCredentials {
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

    /// Runs `command` with `/bin/sh -c` and returns what it printed (at most 1 MiB); its stderr is
    /// discarded (it may hold anything). Fails on a non-zero exit or past the time limit.
    static func run(_ command: String) throws(AWSCredentialError) -> [UInt8] {
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
        let arguments: [UnsafeMutablePointer<CChar>?] = ["/bin/sh", "-c", command].map { (text: String) in strdup(text) }
        defer { for argument in arguments { free(argument) } }
        var argv = arguments + [nil]
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, "/bin/sh", &actions, nil, &argv, environ)
        close(pipes[1])
        defer { close(pipes[0]) }
        guard spawned == 0 else { throw AWSCredentialError("cannot run the credential_process (errno \(spawned))") }
        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        let deadline = monotonicSeconds() + processTimeoutSeconds
        var timedOut = false
        while output.count < 1 << 20 {
            let left = deadline - monotonicSeconds()
            guard left > 0 else {
                timedOut = true
                break
            }
            var poller = pollfd(fd: pipes[0], events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, Int32(left * 1000)) > 0 else { continue }
            let count = buffer.withUnsafeMutableBytes { Glibc.read(pipes[0], $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            output += buffer[0..<count]
        }
        if timedOut { kill(pid, SIGKILL) }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0, errno == EINTR {}
        guard !timedOut else { throw AWSCredentialError("the credential_process ran past \(Int(processTimeoutSeconds)) s") }
        // WIFEXITED and WEXITSTATUS are macros: exited normally with 0 is a status of 0.
        guard status == 0 else { throw AWSCredentialError("the credential_process failed (status \(status))") }
        return output
    }
}
