import COpenSSL

/// SHA-256 and HMAC-SHA256 from OpenSSL's libcrypto (already linked by libcurl).
public enum HMACSHA256 {
    /// `HMAC(EVP_sha256(), key, data)`: 32 bytes.
    public static func authenticationCode(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: 32)
        let ok = key.withUnsafeBytes { keyBytes in
            message.withUnsafeBufferPointer { messageBytes in
                output.withUnsafeMutableBufferPointer { out in
                    bh_hmac_sha256(
                        keyBytes.baseAddress, Int32(keyBytes.count), messageBytes.baseAddress, messageBytes.count,
                        out.baseAddress)
                }
            }
        }
        precondition(ok == 1, "HMAC-SHA256 failed in libcrypto")
        return output
    }

    /// Constant-time comparison of two byte strings (`CRYPTO_memcmp`).
    public static func equal(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        return a.withUnsafeBytes { left in
            b.withUnsafeBytes { right in CRYPTO_memcmp(left.baseAddress, right.baseAddress, a.count) == 0 }
        }
    }
}

/// An incremental SHA-256 (`EVP_DigestUpdate`), for digests computed while a body is read.
public final class SHA256Hasher {
    private let context: OpaquePointer

    public init() {
        guard let context = bh_sha256_new() else { fatalError("libcrypto cannot make a SHA-256 context") }
        self.context = context
    }

    deinit { EVP_MD_CTX_free(context) }

    public func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        EVP_DigestUpdate(context, base, bytes.count)
    }

    public func update(_ bytes: [UInt8]) { bytes.withUnsafeBytes { update($0) } }

    /// The digest; the hasher is spent after this.
    public func finish() -> [UInt8] {
        var output = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        output.withUnsafeMutableBufferPointer { _ = EVP_DigestFinal_ex(context, $0.baseAddress, &length) }
        return output
    }

    /// Lower-case hexadecimal, as form fields and logs write digests.
    public static func hex(_ digest: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(digest.count * 2)
        for byte in digest {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    public static func digest(_ bytes: [UInt8]) -> [UInt8] {
        let hasher = SHA256Hasher()
        hasher.update(bytes)
        return hasher.finish()
    }
}
