import BackhaulCore
import BackhaulWebhooks
import Digest
import Testing

@Suite("Webhook signatures and delivery plan")
struct WebhookTests {
    @Test("the Standard Webhooks reference vector")
    func referenceVector() {
        let key = WebhookRecord.key(of: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") ?? []
        let signature = WebhookSigner.signature(
            key: key, id: "msg_p5jXN8AQM9LWM0D4loKWxJek",
            timestamp: 1_614_265_330, body: Array(#"{"test": 2432232314}"#.utf8))
        #expect(signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
    }

    @Test("during a rotation both signatures are sent, space-separated, new first")
    func rotation() {
        let body = Array("{}".utf8)
        let new = WebhookRecord.generateSecret()
        let old = WebhookRecord.generateSecret()
        let keys = [new, old].compactMap(WebhookRecord.key(of:))
        #expect(keys.count == 2)
        let header = WebhookSigner.header(keys: keys, id: "msg_1", timestamp: 5, body: body)
        let parts = header.split(separator: " ").map(String.init)
        #expect(
            parts == [
                WebhookSigner.signature(key: keys[0], id: "msg_1", timestamp: 5, body: body),
                WebhookSigner.signature(key: keys[1], id: "msg_1", timestamp: 5, body: body),
            ])
        var webhook = WebhookRecord(id: "w", sessionID: "s", url: "http://h/", events: [], secret: new, createdAt: 0)
        webhook.previousSecret = old
        webhook.previousSecretExpiresAt = 100
        #expect(webhook.signingSecrets(now: 50) == [new, old])
        #expect(webhook.signingSecrets(now: 150) == [new])
    }

    @Test(
        "secrets: generated ones are valid keys; malformed ones are refused",
        arguments: [
            ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true), ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", false), ("whsec_", false),
            ("whsec_c2hvcnQ=", false), ("whsec_!!!!", false),
        ])
    func secrets(_ secret: String, _ valid: Bool) {
        #expect((WebhookRecord.key(of: secret) != nil) == valid)
        #expect(WebhookRecord.key(of: WebhookRecord.generateSecret())?.count == 24)
    }

    @Test("SHA-256 and HMAC-SHA256 known answers (RFC 4231 case 2)")
    func digests() {
        let hex = { (bytes: [UInt8]) in
            bytes.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
        }
        #expect(hex(SHA256Hasher.digest(Array("abc".utf8))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(
            hex(HMACSHA256.authenticationCode(key: Array("Jefe".utf8), message: Array("what do ya want for nothing?".utf8)))
                == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    }

    static let schedule = DeliveryPlan.standardSchedule

    @Test(
        "delivery decisions",
        arguments: [
            (Optional(200), 1, DeliveryPlan.Decision.delivered), (204, 1, .delivered), (410, 1, .gone), (410, 10, .gone),
            (500, 1, .retry(at: 1005)), (nil, 1, .retry(at: 1005)), (429, 2, .retry(at: 1300)), (400, 3, .retry(at: 2800)),
            (503, 9, .retry(at: 87_400)), (503, 10, .failed), (nil, 10, .failed),
        ])
    func decisions(_ status: Int?, _ attempts: Int, _ expected: DeliveryPlan.Decision) {
        #expect(
            DeliveryPlan.decide(status: status, retryAfter: nil, attempts: attempts, now: 1000, schedule: Self.schedule)
                == expected)
    }

    @Test("the schedule spans at least 24 hours; Retry-After is a floor")
    func scheduleSpan() {
        #expect(Self.schedule.reduce(0, +) >= 86_400)
        #expect(DeliveryPlan.decide(status: 429, retryAfter: 60, attempts: 1, now: 0, schedule: Self.schedule) == .retry(at: 60))
        #expect(DeliveryPlan.decide(status: 429, retryAfter: 1, attempts: 2, now: 0, schedule: Self.schedule) == .retry(at: 300))
    }
}
