import COpenSSL

/// Standard Webhooks signatures: `v1,` + base64(HMAC-SHA256(key, "id.timestamp.body")), where the
/// key is the base64 part of a `whsec_…` secret (`WebhookRecord.key(of:)` decodes it). Several
/// keys (a rotation) give several signatures separated by spaces. Here, beside the HMAC, so that
/// webhook deliveries and the engine's signer requests sign alike.
public enum WebhookSigner {
    public static func signature(key: [UInt8], id: String, timestamp: Int64, body: [UInt8]) -> String {
        let message = Array("\(id).\(timestamp).".utf8) + body
        return "v1," + base64(HMACSHA256.authenticationCode(key: key, message: message))
    }

    /// The `webhook-signature` header value.
    public static func header(keys: [[UInt8]], id: String, timestamp: Int64, body: [UInt8]) -> String {
        keys.map { signature(key: $0, id: id, timestamp: timestamp, body: body) }.joined(separator: " ")
    }

    /// The header lines of a signed JSON POST, as libcurl takes them: the content type, the three
    /// `webhook-*` headers, and no `Expect: 100-continue` (a receiver answers the whole request).
    public static func headerLines(keys: [[UInt8]], id: String, timestamp: Int64, body: [UInt8]) -> [String] {
        [
            "Content-Type: application/json", "webhook-id: \(id)", "webhook-timestamp: \(timestamp)",
            "webhook-signature: \(header(keys: keys, id: id, timestamp: timestamp, body: body))", "Expect:",
        ]
    }

    /// Standard base64 with padding (`EVP_EncodeBlock`, which writes no line breaks).
    static func base64(_ bytes: [UInt8]) -> String {
        var output = [UInt8](repeating: 0, count: (bytes.count + 2) / 3 * 4 + 1)
        let written = bytes.withUnsafeBufferPointer { input in
            output.withUnsafeMutableBufferPointer { out in EVP_EncodeBlock(out.baseAddress, input.baseAddress, Int32(input.count))
            }
        }
        return String(decoding: output.prefix(Int(max(0, written))), as: UTF8.self)
    }
}
