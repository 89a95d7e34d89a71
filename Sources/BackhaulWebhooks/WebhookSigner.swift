import BackhaulCore
import Digest

/// Standard Webhooks signatures: `v1,` + base64(HMAC-SHA256(key, "id.timestamp.body")), where
/// the key is the base64 part of a `whsec_…` secret. Several secrets (a rotation) give several
/// signatures separated by spaces.
public enum WebhookSigner {
    public static func signature(secret: String, id: String, timestamp: Int64, body: [UInt8]) -> String? {
        guard let key = WebhookRecord.key(of: secret) else { return nil }
        let message = Array("\(id).\(timestamp).".utf8) + body
        return "v1," + Base64.encode(HMACSHA256.authenticationCode(key: key, message: message))
    }

    /// The `webhook-signature` header value.
    public static func header(secrets: [String], id: String, timestamp: Int64, body: [UInt8]) -> String {
        secrets.compactMap { signature(secret: $0, id: id, timestamp: timestamp, body: body) }.joined(separator: " ")
    }
}
