import BackhaulCore
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

    @Test("kept until 5 minutes before Expiration, then asked again; invalidate asks at once")
    func renewal() throws {
        let directory = try scratch()
        defer { try? FileManager.default.removeItem(at: directory) }
        let expiration = "1970-01-12T15:46:40Z"  // 1,000,000 + 7,200 s
        let (config, _) = try processProfile(directory, expiration: expiration)
        let clock = TestClock()
        let chain = AWSCredentialChain(
            environment: ["AWS_CONFIG_FILE": config, "AWS_PROFILE": "p", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"],
            clock: clock)
        #expect(try chain.credentials().accessKeyID == "ASIA1")
        #expect(try chain.credentials().sessionToken == "t1")
        clock.advance(7_200 - 301)
        #expect(try chain.credentials().accessKeyID == "ASIA1", "more than 5 minutes left: kept")
        clock.advance(2)
        #expect(try chain.credentials().accessKeyID == "ASIA2", "within 5 minutes of Expiration: renewed")
        chain.invalidate()
        #expect(try chain.credentials().accessKeyID == "ASIA3")
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
        #expect(try chain.credentials().accessKeyID == "AKIAENV")
        #expect(!FileManager.default.fileExists(atPath: runs), "the process did not run")
        let none = AWSCredentialChain(environment: [
            "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        ])
        #expect(throws: AWSCredentialError.self) { try none.credentials() }
        let failing = directory.appendingPathComponent("failing").path
        try "[default]\ncredential_process = sh -c 'echo secret-on-stderr >&2; exit 3'\n".write(
            toFile: failing, atomically: true, encoding: .utf8)
        let broken = AWSCredentialChain(environment: ["AWS_CONFIG_FILE": failing, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"])
        do {
            _ = try broken.credentials()
            Issue.record("a failing credential_process gave credentials")
        } catch {
            #expect(error.description.contains("failed") && !error.description.contains("secret-on-stderr"))
        }
    }
}
