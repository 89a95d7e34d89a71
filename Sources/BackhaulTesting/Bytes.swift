import Digest
import Foundation

/// Bytes compared in a test: `#expect(Bytes(received) == Bytes(sent))`.
///
/// Swift Testing diffs two collections that compare unequal to show what changed. For megabytes
/// of `Data` that diff runs for hours (a failed download check once held CI until its time limit),
/// and the bytes themselves would be unreadable anyway. Wrapped, a failure shows each side's size,
/// and digest.
public struct Bytes: Equatable, CustomStringConvertible {
    public let data: Data?

    public init(_ data: Data?) { self.data = data }

    public var description: String {
        guard let data else { return "nothing" }
        let digest = SHA256Hasher.digest(Array(data)).prefix(6).map { String(format: "%02x", $0) }.joined()
        return "\(data.count) bytes, sha256 \(digest)…"
    }
}
