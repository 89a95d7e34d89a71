import CGlibc

/// glibc's allocator thresholds (mallopt(3)).
public enum Heap {
    /// Blocks up to `mmapThreshold` bytes come from the heap instead of a mapping of their own
    /// (`M_MMAP_THRESHOLD`), and the heap's free top goes back to the kernel only beyond
    /// `trimThreshold` bytes (`M_TRIM_THRESHOLD`).
    public static func keep(blocksUpTo mmapThreshold: Int32, trimmingAbove trimThreshold: Int32) {
        mallopt(M_MMAP_THRESHOLD, mmapThreshold)
        mallopt(M_TRIM_THRESHOLD, trimThreshold)
    }
}
