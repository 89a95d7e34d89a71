import Foundation

/// A throwaway certificate for 127.0.0.1 (`openssl req -x509`), with its key, for TLS peers; the
/// certificate is its own CA, so a client trusts it when given it as its CA bundle.
public struct SelfSignedCertificate {
    public let certificate: String
    public let key: String

    /// Writes `cert.pem` and `key.pem` in `directory`.
    public init(directory: String) throws {
        certificate = directory + "/cert.pem"
        key = directory + "/key.pem"
        let openssl = Process()
        openssl.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        openssl.arguments = [
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", certificate,
        ]
        openssl.standardError = FileHandle.nullDevice
        try openssl.run()
        openssl.waitUntilExit()
        guard openssl.terminationStatus == 0 else {
            throw CertificateError(directory: directory)
        }
    }
}

/// openssl could not make the certificate.
public struct CertificateError: Error, CustomStringConvertible {
    public var directory: String
    public var description: String { "openssl could not make a certificate in \(directory)" }
}
