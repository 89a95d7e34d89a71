import CGlibc

/// The kernel's random bytes (getrandom(2)), for the domain, which imports no C module.
public enum KernelRandom {
    /// Fills `buffer` (`bh_getrandom`, i.e. getrandom(2) with no flags); how many bytes were
    /// filled, or -1. A read of more than 256 bytes can come back short when a signal interrupts it.
    public static func fill(_ buffer: UnsafeMutableRawBufferPointer) -> Int {
        bh_getrandom(buffer.baseAddress, buffer.count)
    }
}
