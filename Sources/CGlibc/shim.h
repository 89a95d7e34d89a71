#ifndef BACKHAUL_CGLIBC_SHIM_H
#define BACKHAUL_CGLIBC_SHIM_H
// What the C library has and Swift's Glibc module does not bring in.
#include <malloc.h>
#include <pthread.h>
#include <spawn.h>
#include <sys/random.h>
#include <sys/types.h>

/// getrandom(2): fills `length` bytes from the kernel's generator, or returns -1 (errno set).
static inline ssize_t bh_getrandom(void *buffer, size_t length) {
    return getrandom(buffer, length, 0);
}

/// pthread_setname_np(3), which <pthread.h> declares only under _GNU_SOURCE: names a thread
/// (at most 15 bytes), as `top -H` and /proc/PID/task/*/comm show it.
int pthread_setname_np(pthread_t thread, const char *name);

/// posix_spawn_file_actions_addclosefrom_np(3) (glibc 2.34), which <spawn.h> declares only under
/// _GNU_SOURCE: the child closes every descriptor from `from` up.
int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *actions, int from);

#endif
