import CGlibc

/// openat2(2) for the domain, which imports no C module.
public enum OpenBeneath {
    /// Opens the absolute `path` walked from `/` with no component a symbolic link
    /// (`bh_openat2_no_symlinks`: openat2 with `RESOLVE_NO_SYMLINKS`); `Beneath` has checked that
    /// the path lies beneath its allowed root and has no `.` or `..` component. A descriptor, or
    /// -1 with errno set: ELOOP for a symbolic link, ENOTDIR for a component that is not a
    /// directory, ENOSYS where the kernel or a seccomp profile does not have the call.
    public static func open(_ path: String, flags: Int32) -> Int32 {
        bh_openat2_no_symlinks(path, flags)
    }

    /// `O_PATH`: opens a name to look at (`fstat`) without opening the file (a FIFO does not block).
    public static let pathOnly = bh_o_path()
}
