/*
 * syncfault: makes fsync(2) and fdatasync(2) fail, for the tests of a failed sync of the state
 * (LD_PRELOAD=syncfault.so). Nothing changes until the file named by SYNCFAULT_TRIGGER exists;
 * from then on every sync of a file whose path contains SYNCFAULT_PATH fails with SYNCFAULT_ERRNO
 * ("EIO", "ENOSPC"; default EIO) without reaching the kernel, and each such failure adds a line to
 * the file named by SYNCFAULT_LOG. With SYNCFAULT_PATH unset, every file's sync fails.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int injected_errno(void) {
    const char *name = getenv("SYNCFAULT_ERRNO");
    if (name && strcmp(name, "ENOSPC") == 0) return ENOSPC;
    return EIO;
}

/* Whether a sync of `fd` is to fail now (and records it). errno is left as it was. */
static int should_fail(int fd, const char *call) {
    int saved = errno;
    const char *trigger = getenv("SYNCFAULT_TRIGGER");
    int fail = 0;
    if (trigger && access(trigger, F_OK) == 0) {
        char link[64], path[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t length = readlink(link, path, sizeof path - 1);
        path[length > 0 ? length : 0] = 0;
        const char *wanted = getenv("SYNCFAULT_PATH");
        fail = wanted == NULL || strstr(path, wanted) != NULL;
        const char *log = getenv("SYNCFAULT_LOG");
        if (fail && log) {
            int out = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
            if (out >= 0) {
                dprintf(out, "%s %s\n", call, path);
                close(out);
            }
        }
    }
    errno = saved;
    return fail;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (should_fail(fd, "fsync")) {
        errno = injected_errno();
        return -1;
    }
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    if (should_fail(fd, "fdatasync")) {
        errno = injected_errno();
        return -1;
    }
    return real(fd);
}
