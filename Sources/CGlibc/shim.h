#ifndef BACKHAUL_CGLIBC_SHIM_H
#define BACKHAUL_CGLIBC_SHIM_H
// What the C library has and Swift's Glibc module does not bring in.
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <spawn.h>
#include <sys/random.h>
#include <sys/types.h>
#include <unistd.h>

/// getrandom(2): fills `length` bytes from the kernel's generator, or returns -1 (errno set).
static inline ssize_t bh_getrandom(void *buffer, size_t length) {
    return getrandom(buffer, length, 0);
}

/// pthread_setname_np(3), which <pthread.h> declares only under _GNU_SOURCE: names a thread
/// (at most 15 bytes), as `top -H` and /proc/PID/task/*/comm show it.
int pthread_setname_np(pthread_t thread, const char *name);

/// openat2(2) with RESOLVE_NO_SYMLINKS, through syscall(2) (glibc 2.36 has no wrapper): opens the
/// absolute `path` walked from `/`, refusing any component that is a symbolic link (ELOOP). A
/// descriptor, or -1 with errno set (ENOSYS where the kernel or a seccomp profile lacks the call).
static inline int bh_openat2_no_symlinks(const char *path, int flags) {
#ifdef SYS_openat2
    struct open_how how = {0};
    how.flags = (uint64_t)(unsigned int)flags;
    how.resolve = RESOLVE_NO_SYMLINKS;
    return (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how);
#else
    errno = ENOSYS;
    return -1;
#endif
}
/// O_PATH, which <fcntl.h> names only under _GNU_SOURCE (glibc's `__O_PATH` is the same value):
/// opens a name to look at (fstat) without opening the file itself (a FIFO does not block).
static inline int bh_o_path(void) { return __O_PATH; }
/// posix_spawn_file_actions_addclosefrom_np(3) (glibc 2.34), which <spawn.h> declares only under
/// _GNU_SOURCE: the child closes every descriptor from `from` up.
int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *actions, int from);

#endif
