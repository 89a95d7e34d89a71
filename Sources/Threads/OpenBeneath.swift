import CGlibc

/// openat2(2) for the domain, which imports no C module.
public enum OpenBeneath {
    /// Opens `path` relative to the directory `directory` (`bh_openat2_beneath`: openat2 with
    /// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`): no component may be a symbolic link or lead out of
    /// `directory`. A descriptor, or -1 with errno set: ELOOP for a symbolic link, EXDEV for a way
    /// out, ENOSYS where the kernel or a seccomp profile does not have the call.
    public static func open(_ directory: Int32, _ path: String, flags: Int32, mode: UInt32 = 0) -> Int32 {
        bh_openat2_beneath(directory, path, flags, mode)
    }
}
