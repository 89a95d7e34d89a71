import BackhaulCore
import BackhaulTesting
import Foundation
import Synchronization
import Testing

@testable import BackhaulEngine

/// The chain's order and renewal, with a `credential_process` of a few lines of shell that counts
/// its runs, and a clock the test moves.
@Suite("AWS credential chain")
struct AWSCredentialChainTests {
    final class TestClock: Clock {
        let time = Mutex<Timestamp>(1_000_000)
        func now() -> Timestamp { time.withLock { $0 } }
        func advance(_ seconds: Double) { time.withLock { $0 += seconds } }
    }

    /// A config file whose profile `p` runs a script printing keys numbered by its run, expiring
    /// at `expiration`.
    func processProfile(_ directory: URL, expiration: String) throws -> (config: String, runs: String) {
        let runs = directory.appendingPathComponent("runs").path
        let script = directory.appendingPathComponent("keys.sh").path
        try """
        n=$(( $(cat \(runs) 2>/dev/null || echo 0) + 1 )); echo $n > \(runs)
        echo "{\\"Version\\": 1, \\"AccessKeyId\\": \\"ASIA$n\\", \\"SecretAccessKey\\": \\"s$n\\", \\"SessionToken\\": \\"t$n\\", \\"Expiration\\": \\"\(expiration)\\"}"
        """.write(toFile: script, atomically: true, encoding: .utf8)
        let config = directory.appendingPathComponent("config").path
        try "[profile p]\ncredential_process = sh \(script)\n".write(toFile: config, atomically: true, encoding: .utf8)
        return (config, runs)
    }

    func scratch() throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("aws-chain-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    /// The keys the chain holds once its thread has looked them up (within `timeout` seconds).
    func keys(_ chain: AWSCredentialChain, timeout: Double = 10, until done: (AWSCredentials) -> Bool = { _ in true })
        -> AWSCredentials?
    {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let keys = chain.keys(), done(keys) { return keys }
            Thread.sleep(forTimeInterval: 0.01)
        }
        return nil
    }

    /// Whether `condition` holds within `timeout` seconds.
    func within(_ timeout: Double, _ condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if condition() { return true }
            Thread.sleep(forTimeInterval: 0.02)
        }
        return condition()
    }

    /// How long `body` took (seconds).
    func seconds(_ body: () -> Void) -> Double {
        let start = Date()
        body()
        return Date().timeIntervalSince(start)
    }

    @Test("kept until 5 minutes before Expiration, then renewed in the background; invalidate asks at once")
    func renewal() throws {
        let directory = try scratch()
        defer { try? FileManager.default.removeItem(at: directory) }
        let expiration = "1970-01-12T15:46:40Z"  // 1,000,000 + 7,200 s
        let (config, _) = try processProfile(directory, expiration: expiration)
        let clock = TestClock()
        let chain = AWSCredentialChain(
            environment: ["AWS_CONFIG_FILE": config, "AWS_PROFILE": "p", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"],
            clock: clock)
        defer { chain.stop() }
        #expect(chain.keys() == nil, "the first ask finds nothing and does not wait")
        #expect(keys(chain)?.accessKeyID == "ASIA1")
        #expect(chain.keys()?.sessionToken == "t1")
        clock.advance(7_200 - 301)
        #expect(chain.keys()?.accessKeyID == "ASIA1", "more than 5 minutes left: kept")
        Thread.sleep(forTimeInterval: 0.3)
        #expect(chain.resolutions == 1, "and not asked again")
        clock.advance(2)
        #expect(chain.keys()?.accessKeyID == "ASIA1", "within 5 minutes of Expiration: still valid, used meanwhile")
        #expect(keys(chain) { $0.accessKeyID == "ASIA2" } != nil, "renewed")
        chain.invalidate()
        #expect(keys(chain) { $0.accessKeyID == "ASIA3" } != nil)
        #expect(chain.resolutions == 3)
    }

    @Test("the environment comes first; nothing anywhere is an error that names no secret")
    func order() throws {
        let directory = try scratch()
        defer { try? FileManager.default.removeItem(at: directory) }
        let (config, runs) = try processProfile(directory, expiration: "2099-01-01T00:00:00Z")
        let chain = AWSCredentialChain(environment: [
            "AWS_ACCESS_KEY_ID": "AKIAENV", "AWS_SECRET_ACCESS_KEY": "env-secret", "AWS_CONFIG_FILE": config, "AWS_PROFILE": "p",
        ])
        defer { chain.stop() }
        #expect(keys(chain)?.accessKeyID == "AKIAENV")
        #expect(!FileManager.default.fileExists(atPath: runs), "the process did not run")
        let none = AWSCredentialChain(environment: [
            "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        ])
        defer { none.stop() }
        #expect(throws: AWSCredentialError.self) { try none.credentials() }
        #expect(within(10) { none.lastError?.contains("no AWS credentials") == true })
        let failing = directory.appendingPathComponent("failing").path
        try "[default]\ncredential_process = sh -c 'echo secret-on-stderr >&2; exit 3'\n".write(
            toFile: failing, atomically: true, encoding: .utf8)
        let broken = AWSCredentialChain(environment: ["AWS_CONFIG_FILE": failing, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"])
        defer { broken.stop() }
        _ = broken.keys()
        #expect(within(10) { broken.lastError != nil })
        let error = broken.lastError ?? ""
        #expect(error.contains("failed") && !error.contains("secret-on-stderr"), "\(error)")
    }

    @Test("a failed lookup is kept: asked a thousand times in 2.5 s, a failing source runs twice (backoff 1 s, then 2 s)")
    func failureBackoff() throws {
        let directory = try scratch()
        defer { try? FileManager.default.removeItem(at: directory) }
        let runs = directory.appendingPathComponent("runs").path
        let config = directory.appendingPathComponent("config").path
        try "[default]\ncredential_process = sh -c 'echo x >> \(runs); exit 1'\n".write(
            toFile: config, atomically: true, encoding: .utf8)
        let chain = AWSCredentialChain(environment: ["AWS_CONFIG_FILE": config, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"])
        defer { chain.stop() }
        let start = Date()
        var asked = 0
        while Date().timeIntervalSince(start) < 2.5 {
            _ = chain.keys()
            asked += 1
            Thread.sleep(forTimeInterval: 0.0025)
        }
        let count = ((try? String(contentsOfFile: runs, encoding: .utf8)) ?? "").split(separator: "\n").count
        print("credential chain: \(asked) asks in 2.5 s ran the failing source \(count) times")
        #expect(count == 2, "runs of the failing source: \(count)")
    }

    @Test("asking never waits on a source: a credential_process that sleeps 20 s leaves keys() answering in microseconds")
    func neverWaits() throws {
        let directory = try scratch()
        defer { try? FileManager.default.removeItem(at: directory) }
        let config = directory.appendingPathComponent("config").path
        try "[default]\ncredential_process = sleep 20\n".write(toFile: config, atomically: true, encoding: .utf8)
        let chain = AWSCredentialChain(environment: ["AWS_CONFIG_FILE": config, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"])
        defer { chain.stop() }
        var longest = 0.0
        for _ in 0..<100 {
            longest = max(longest, seconds { _ = chain.keys() })
            Thread.sleep(forTimeInterval: 0.005)
        }
        #expect(longest < 0.05, "the longest ask took \(longest) s")
        #expect(throws: AWSCredentialError.self) { try chain.credentials() }
    }

    @Test("a credential_process that prints without end is killed past 1 MiB, with its group; the lookup fails")
    func endlessOutput() throws {
        let outcome = Mutex<String?>(nil)
        let thread = Thread(block: {
            do {
                _ = try AWSCredentialChain.run("yes credential")
                outcome.withLock { $0 = "gave output" }
            } catch {
                outcome.withLock { $0 = "\(error)" }
            }
        })
        thread.start()
        let ended = within(10) { outcome.withLock { $0 } != nil }
        #expect(ended, "the lookup ended within 10 s (it blocked in waitpid with a full pipe before)")
        #expect(outcome.withLock { $0 }?.contains("more than 1048576 bytes") == true, "\(outcome.withLock { $0 } ?? "")")
    }

    @Test("a credential_process past its time is killed with its children")
    func processTimeout() throws {
        let start = Date()
        #expect(throws: AWSCredentialError.self) { _ = try AWSCredentialChain.run("sleep 60 & sleep 61; echo {}", timeout: 1) }
        #expect(Date().timeIntervalSince(start) < 5)
    }
}

/// Web identity (IRSA) against moto's STS, through the S3 wrapper that logs the token each
/// `AssumeRoleWithWebIdentity` carried.
extension AWSCredentialChainTests {
    @Test("web identity: STS keys for the role; renewed 5 minutes before Expiration with the token file read again")
    func webIdentity() throws {
        let directory = try scratch()
        defer { try? FileManager.default.removeItem(at: directory) }
        let s3 = try S3Server(directory: directory.path)
        let role = try s3.roleARN()
        #expect(role.hasPrefix("arn:aws:iam::"), "\(role)")
        let tokenFile = directory.appendingPathComponent("token").path
        try "token-one\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
        let clock = TestClock()
        clock.advance(Date().timeIntervalSince1970 - clock.now())
        let chain = AWSCredentialChain(
            environment: [
                "AWS_WEB_IDENTITY_TOKEN_FILE": tokenFile, "AWS_ROLE_ARN": role, "AWS_ROLE_SESSION_NAME": "backhaul-irsa",
                "AWS_ENDPOINT_URL_STS": "http://127.0.0.1:\(s3.peer.port)", "AWS_CONFIG_FILE": "/nonexistent",
                "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            ],
            clock: clock)
        defer { chain.stop() }
        let first = try #require(keys(chain, timeout: 20), "keys from STS: \(chain.lastError ?? "")")
        #expect(first.sessionToken?.isEmpty == false)
        let expiration = try #require(first.expiration)
        #expect(abs(expiration - clock.now() - 3600) < 120, "moto's default hour")
        // Kubernetes rotates the projected token; the next renewal reads it again.
        try "token-two\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
        clock.advance(expiration - clock.now() - 600)
        Thread.sleep(forTimeInterval: 0.3)
        #expect(chain.keys() == first && chain.resolutions == 1, "10 minutes left: kept")
        clock.advance(301)
        let second = try #require(keys(chain, timeout: 20) { $0.accessKeyID != first.accessKeyID }, "renewed")
        #expect(second.secretAccessKey != first.secretAccessKey)
        let calls = s3.requests.filter { $0["action"]?.stringValue == "AssumeRoleWithWebIdentity" }
        #expect(calls.compactMap { $0["web_identity_token"]?.stringValue } == ["token-one", "token-two"])
        #expect(calls.allSatisfy { $0["role_session_name"]?.stringValue == "backhaul-irsa" })
    }

    @Test("web identity comes after the environment's keys and before the shared files")
    func webIdentityOrder() throws {
        let directory = try scratch()
        defer { try? FileManager.default.removeItem(at: directory) }
        let (config, runs) = try processProfile(directory, expiration: "2099-01-01T00:00:00Z")
        let tokenFile = directory.appendingPathComponent("token").path
        try "t".write(toFile: tokenFile, atomically: true, encoding: .utf8)
        let web = [
            "AWS_WEB_IDENTITY_TOKEN_FILE": tokenFile, "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/edge",
            "AWS_ENDPOINT_URL_STS": "http://127.0.0.1:1", "AWS_CONFIG_FILE": config, "AWS_PROFILE": "p",
        ]
        let withKeys = AWSCredentialChain(
            environment: web.merging(["AWS_ACCESS_KEY_ID": "AKIAENV", "AWS_SECRET_ACCESS_KEY": "s"]) { $1 })
        defer { withKeys.stop() }
        #expect(keys(withKeys)?.accessKeyID == "AKIAENV")
        let withoutKeys = AWSCredentialChain(environment: web)
        defer { withoutKeys.stop() }
        _ = withoutKeys.keys()
        #expect(within(10) { withoutKeys.lastError?.contains("STS (web identity)") == true }, "\(withoutKeys.lastError ?? "")")
        #expect(!FileManager.default.fileExists(atPath: runs), "the profile's process did not run: web identity came first")
    }
}
