import CGlibc
import Glibc

/// What a `posix_spawn` child is given beyond Swift's Glibc module, for the domain, which imports
/// no C module.
public enum SpawnActions {
    /// Makes the child close every descriptor from `from` up before it runs
    /// (`posix_spawn_file_actions_addclosefrom_np`): it inherits none of the parent's sockets and
    /// files, whether or not they were opened close-on-exec. 0 on success, else an errno.
    public static func closeFrom(_ actions: inout posix_spawn_file_actions_t, _ from: Int32) -> Int32 {
        posix_spawn_file_actions_addclosefrom_np(&actions, from)
    }
}
