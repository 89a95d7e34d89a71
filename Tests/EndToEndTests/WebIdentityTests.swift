import BackhaulTesting
import Foundation
import JSONCodec
import Testing

/// docs/credentials.md: web identity (IRSA) in the AWS chain, against moto's STS.
extension EndToEndTests {
    @Test("s3 from the chain: web identity (IRSA) trades the token file at moto's STS for keys; 9 MiB byte-exact")
    func s3WebIdentity() throws {
        let scratch = TemporaryDirectory("backhaul-aws")
        let s3 = try S3Server(directory: scratch.path)
        let role = try s3.roleARN()
        let token = "irsa-token-\(UInt32.random(in: 0...UInt32.max))"
        let tokenFile = scratch.file("token")
        try token.write(toFile: tokenFile, atomically: true, encoding: .utf8)
        let fixture = try Fixture(
            environment: chainEnvironment(
                scratch,
                [
                    "AWS_WEB_IDENTITY_TOKEN_FILE": tokenFile, "AWS_ROLE_ARN": role, "AWS_ROLE_SESSION_NAME": "backhaul-irsa",
                    "AWS_ENDPOINT_URL_STS": "http://127.0.0.1:\(s3.peer.port)",
                ]))
        try fixture.session()
        let file = fixture.makeFile("irsa.bin", size: 9 * 1024 * 1024 + 5)
        let id = try enqueueS3FromChain(fixture, url: s3.objectURL("irsa/irsa.bin"), file: file)
        let task = try fixture.daemon.waitForTask(id, timeout: 90)
        fixture.expectLog(task["state"]?.stringValue == "completed", "\(task.serialized()) \(s3.requests.suffix(5))")
        #expect(Bytes(s3.object("irsa/irsa.bin")) == Bytes(fixture.contents(file)))
        let calls = s3.requests.filter { $0["action"]?.stringValue == "AssumeRoleWithWebIdentity" }
        #expect(calls.count == 1, "one STS call for the whole upload: \(calls)")
        #expect(calls.first?["web_identity_token"]?.stringValue == token)
        try expectNowhere([token], fixture, task: id)
    }
}
