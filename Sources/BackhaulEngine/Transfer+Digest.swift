import BackhaulCore
import Digest

/// A request's digest header (RFC 9530 `Repr-Digest` / `Content-Digest` of its body), hashed in
/// slices so that other transfers keep moving.
extension Transfer {
    /// Starts hashing the body when the request carries a digest header, and says so; the hashing
    /// then goes on in slices through `hashSlice`, so other transfers keep moving.
    func startHashingIfNeeded(_ request: PlannedRequest) -> Bool {
        guard let header = request.digestHeader, case .file(let offset, let length) = request.body else { return false }
        let range = header.hashedRange ?? offset..<(offset + length)
        pendingDigest = (request, SHA256Hasher(), range.lowerBound, range.upperBound)
        return true
    }

    var isHashing: Bool { pendingDigest != nil }

    /// Hashes up to `budget` bytes of the pending request's body. Returns the request with its
    /// digest header once the whole range is hashed; nil while more remains. Throws when the file
    /// cannot be read (it changed).
    func hashSlice(budget: Int, buffer: UnsafeMutableRawBufferPointer) throws(FileChanged) -> PlannedRequest? {
        guard var pending = pendingDigest else { return nil }
        var left = budget
        while pending.offset < pending.end, left > 0 {
            let window = UnsafeMutableRawBufferPointer(
                rebasing: buffer[0..<Int(min(Int64(buffer.count), pending.end - pending.offset))])
            let count = file?.read(at: pending.offset, into: window) ?? 0
            guard count > 0 else {
                pendingDigest = nil
                fileChangedDuringRead = true
                throw FileChanged()
            }
            pending.hasher.update(UnsafeRawBufferPointer(rebasing: window[0..<count]))
            pending.offset += Int64(count)
            left -= count
        }
        guard pending.offset == pending.end, let header = pending.request.digestHeader else {
            pendingDigest = pending
            return nil
        }
        pendingDigest = nil
        var request = pending.request
        request.headers.append((header.name, header.prefix + Base64.encode(pending.hasher.finish()) + header.suffix))
        request.digestHeader = nil
        return request
    }

    struct FileChanged: Error {}
}
