// The crash-state harness's recorder: an LD_PRELOAD library that sits between backhauld (and the
// SQLite inside it) and the C library, and writes down, in order, every call that changes a file
// under one directory (CRASH_RECORD_DIR): opens, writes with their bytes, truncations, renames,
// unlinks, syncs and closes. The replayer (replay.py) rebuilds from that what a disk may hold after
// a power loss at any point. Nothing here changes what a call does.
//
//   CRASH_RECORD_DIR  the state directory, absolute, as the daemon is given it
//   CRASH_RECORD_OUT  a directory for ops.log (one tab-separated line per call) and data.bin
//                     (the written bytes, back to back; ops.log gives each write's place in it)
//
// ops.log line: ticket, CLOCK_MONOTONIC ns, op, fd, a, b, data offset, path[, path2]
//   open   a = flags, b = 1 when the call created the file
//   write  a = file offset, b = bytes written (data offset: where they are in data.bin)
//   trunc  a = new length
//   fsync / fdatasync / syncrange   a = the call's result
//   close, unlink, rename (path, path2)
//
// Order: each call takes a ticket (a number and the clock, together, under one lock). A write
// takes it before it starts; a sync after it returned. So a write that ended before a sync began
// is ordered before it, and an answer the daemon sent after a sync returned was received after
// the sync's time: the criterion of replay.py relies on both. Lines may reach ops.log out of
// ticket order (a write is logged once it returned); the replayer sorts them.
//
// The -shm file is written through mmap, which no call here sees: it is not durable state (SQLite
// rebuilds it), and the replayer leaves it out of every crash state.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 65536

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char watched[PATH_MAX];
static size_t watched_length;
static int log_fd = -1;
static int data_fd = -1;
static uint64_t next_ticket = 1;
static uint64_t data_end;
// Descriptors of files under the watched directory (the directory itself included).
static unsigned char tracked[MAX_FDS];

// The C library's own functions, found on first use.
#define REAL(name) \
    static __typeof__(name) *real_##name; \
    if (!real_##name) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

static ssize_t raw_write_all(int fd, const void *buffer, size_t count) {
    static ssize_t (*real_write)(int, const void *, size_t);
    if (!real_write) real_write = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    const char *bytes = buffer;
    size_t done = 0;
    while (done < count) {
        ssize_t written = real_write(fd, bytes + done, count - done);
        if (written < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        done += (size_t)written;
    }
    return (ssize_t)done;
}

__attribute__((constructor)) static void start_recording(void) {
    const char *directory = getenv("CRASH_RECORD_DIR");
    const char *out = getenv("CRASH_RECORD_OUT");
    if (!directory || !out || !*directory || !*out) return;
    snprintf(watched, sizeof watched, "%s", directory);
    watched_length = strlen(watched);
    while (watched_length > 1 && watched[watched_length - 1] == '/') watched[--watched_length] = 0;
    char path[PATH_MAX];
    int (*real_open)(const char *, int, ...) = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    snprintf(path, sizeof path, "%s/ops.log", out);
    log_fd = real_open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    snprintf(path, sizeof path, "%s/data.bin", out);
    data_fd = real_open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat info;
    if (data_fd >= 0 && fstat(data_fd, &info) == 0) data_end = (uint64_t)info.st_size;
    if (log_fd < 0 || data_fd < 0) {
        fprintf(stderr, "recorder: cannot open %s/ops.log or data.bin\n", out);
        watched_length = 0;
    }
}

static int recording(void) { return watched_length > 0; }

static int is_tracked(int fd) { return fd >= 0 && fd < MAX_FDS && tracked[fd]; }

// The path relative to the watched directory ("" for the directory itself), or NULL when the
// path is elsewhere. `dirfd` and relative paths are resolved the way the call would.
static const char *watched_name(int dirfd, const char *path, char *buffer) {
    if (!recording() || !path) return NULL;
    char base[PATH_MAX];
    if (path[0] == '/') {
        snprintf(buffer, PATH_MAX, "%s", path);
    } else {
        if (dirfd == AT_FDCWD) {
            if (!getcwd(base, sizeof base)) return NULL;
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t length = readlink(link, base, sizeof base - 1);
            if (length < 0) return NULL;
            base[length] = 0;
        }
        if ((size_t)snprintf(buffer, PATH_MAX, "%.2047s/%.2047s", base, path) >= PATH_MAX) return NULL;
    }
    if (strncmp(buffer, watched, watched_length) != 0) return NULL;
    const char *rest = buffer + watched_length;
    if (*rest == 0) return rest;
    if (*rest != '/') return NULL;
    while (*rest == '/') rest++;
    return rest;
}

struct ticket {
    uint64_t number;
    uint64_t nanoseconds;
};

// Called with the lock held.
static struct ticket take_ticket(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    struct ticket ticket = {next_ticket++, (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec};
    return ticket;
}

// Called with the lock held.
static void log_line(struct ticket ticket, const char *op, int fd, long long a, long long b, long long data,
                     const char *path, const char *path2) {
    char line[2 * PATH_MAX + 200];
    int length = snprintf(line, sizeof line, "%llu\t%llu\t%s\t%d\t%lld\t%lld\t%lld\t%s%s%s\n",
                          (unsigned long long)ticket.number, (unsigned long long)ticket.nanoseconds, op, fd, a, b,
                          data, path ? path : "", path2 ? "\t" : "", path2 ? path2 : "");
    if (length > 0) raw_write_all(log_fd, line, (size_t)length < sizeof line ? (size_t)length : sizeof line - 1);
}

static void record_simple(const char *op, int fd, long long a, const char *path, const char *path2) {
    pthread_mutex_lock(&lock);
    log_line(take_ticket(), op, fd, a, 0, -1, path, path2);
    pthread_mutex_unlock(&lock);
}

// A write that returned `count` bytes at `offset`, ticketed before it started.
static void record_write(struct ticket ticket, int fd, off_t offset, const struct iovec *pieces, int count,
                         ssize_t written) {
    pthread_mutex_lock(&lock);
    uint64_t at = data_end;
    size_t left = (size_t)written;
    for (int index = 0; index < count && left > 0; index++) {
        size_t part = pieces[index].iov_len < left ? pieces[index].iov_len : left;
        raw_write_all(data_fd, pieces[index].iov_base, part);
        left -= part;
    }
    data_end += (uint64_t)written;
    log_line(ticket, "write", fd, (long long)offset, (long long)written, (long long)at, NULL, NULL);
    pthread_mutex_unlock(&lock);
}

static struct ticket ticket_now(void) {
    pthread_mutex_lock(&lock);
    struct ticket ticket = take_ticket();
    pthread_mutex_unlock(&lock);
    return ticket;
}

static int after_open(int fd, int flags, const char *name, int existed) {
    if (fd < 0 || !name || fd >= MAX_FDS) return fd;
    int created = (flags & O_CREAT) && !existed;
    pthread_mutex_lock(&lock);
    tracked[fd] = 1;
    log_line(take_ticket(), "open", fd, flags, created, -1, name, NULL);
    pthread_mutex_unlock(&lock);
    return fd;
}

static int existed_at(int dirfd, const char *path) {
    struct stat info;
    return fstatat(dirfd, path, &info, 0) == 0;
}

static int open_common(int dirfd, const char *path, int flags, mode_t mode, int (*call)(int, const char *, int, ...)) {
    char buffer[PATH_MAX];
    const char *name = watched_name(dirfd, path, buffer);
    int existed = name ? existed_at(dirfd, path) : 1;
    int fd = call(dirfd, path, flags, mode);
    int saved = errno;
    if (name) after_open(fd, flags, name, existed);
    errno = saved;
    return fd;
}

static int call_openat(int dirfd, const char *path, int flags, ...) {
    va_list list;
    va_start(list, flags);
    mode_t mode = va_arg(list, mode_t);
    va_end(list);
    static int (*real)(int, const char *, int, ...);
    if (!real) real = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat");
    return real(dirfd, path, flags, mode);
}

static mode_t mode_argument(int flags, va_list list) {
    if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) return va_arg(list, mode_t);
    return 0;
}

int open(const char *path, int flags, ...) {
    va_list list;
    va_start(list, flags);
    mode_t mode = mode_argument(flags, list);
    va_end(list);
    return open_common(AT_FDCWD, path, flags, mode, call_openat);
}

int open64(const char *path, int flags, ...) {
    va_list list;
    va_start(list, flags);
    mode_t mode = mode_argument(flags, list);
    va_end(list);
    return open_common(AT_FDCWD, path, flags, mode, call_openat);
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list list;
    va_start(list, flags);
    mode_t mode = mode_argument(flags, list);
    va_end(list);
    return open_common(dirfd, path, flags, mode, call_openat);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    va_list list;
    va_start(list, flags);
    mode_t mode = mode_argument(flags, list);
    va_end(list);
    return open_common(dirfd, path, flags, mode, call_openat);
}

// The fortified forms (_FORTIFY_SOURCE) never create with a mode.
int __open_2(const char *path, int flags) { return open_common(AT_FDCWD, path, flags, 0, call_openat); }
int __open64_2(const char *path, int flags) { return open_common(AT_FDCWD, path, flags, 0, call_openat); }
int __openat_2(int dirfd, const char *path, int flags) { return open_common(dirfd, path, flags, 0, call_openat); }
int __openat64_2(int dirfd, const char *path, int flags) { return open_common(dirfd, path, flags, 0, call_openat); }

int close(int fd) {
    REAL(close);
    if (is_tracked(fd)) {
        pthread_mutex_lock(&lock);
        tracked[fd] = 0;
        log_line(take_ticket(), "close", fd, 0, 0, -1, NULL, NULL);
        pthread_mutex_unlock(&lock);
    }
    return real_close(fd);
}

static ssize_t traced_write(int fd, const struct iovec *pieces, int count, off_t offset, int positioned,
                            ssize_t (*call)(int, const struct iovec *, int, off_t)) {
    struct ticket ticket = ticket_now();
    if (!positioned) {
        offset = lseek(fd, 0, SEEK_CUR);
        if (fcntl(fd, F_GETFL) & O_APPEND) {
            struct stat info;
            if (fstat(fd, &info) == 0) offset = info.st_size;
        }
    }
    ssize_t written = call(fd, pieces, count, offset);
    int saved = errno;
    if (written > 0) record_write(ticket, fd, offset, pieces, count, written);
    errno = saved;
    return written;
}

static ssize_t do_write(int fd, const struct iovec *pieces, int count, off_t offset) {
    (void)offset;
    REAL(writev);
    return real_writev(fd, pieces, count);
}

static ssize_t do_pwrite(int fd, const struct iovec *pieces, int count, off_t offset) {
    REAL(pwritev);
    return real_pwritev(fd, pieces, count, offset);
}

ssize_t write(int fd, const void *buffer, size_t count) {
    if (!is_tracked(fd)) {
        REAL(write);
        return real_write(fd, buffer, count);
    }
    struct iovec piece = {(void *)buffer, count};
    return traced_write(fd, &piece, 1, 0, 0, do_write);
}

ssize_t writev(int fd, const struct iovec *pieces, int count) {
    if (!is_tracked(fd)) {
        REAL(writev);
        return real_writev(fd, pieces, count);
    }
    return traced_write(fd, pieces, count, 0, 0, do_write);
}

ssize_t pwrite(int fd, const void *buffer, size_t count, off_t offset) {
    if (!is_tracked(fd)) {
        REAL(pwrite);
        return real_pwrite(fd, buffer, count, offset);
    }
    struct iovec piece = {(void *)buffer, count};
    return traced_write(fd, &piece, 1, offset, 1, do_pwrite);
}

ssize_t pwrite64(int fd, const void *buffer, size_t count, off_t offset) {
    if (!is_tracked(fd)) {
        REAL(pwrite64);
        return real_pwrite64(fd, buffer, count, offset);
    }
    struct iovec piece = {(void *)buffer, count};
    return traced_write(fd, &piece, 1, offset, 1, do_pwrite);
}

ssize_t pwritev(int fd, const struct iovec *pieces, int count, off_t offset) {
    if (!is_tracked(fd)) {
        REAL(pwritev);
        return real_pwritev(fd, pieces, count, offset);
    }
    return traced_write(fd, pieces, count, offset, 1, do_pwrite);
}

static int traced_truncate(int fd, off_t length, int result) {
    if (result == 0 && is_tracked(fd)) record_simple("trunc", fd, (long long)length, NULL, NULL);
    return result;
}

int ftruncate(int fd, off_t length) {
    REAL(ftruncate);
    int result = real_ftruncate(fd, length);
    int saved = errno;
    traced_truncate(fd, length, result);
    errno = saved;
    return result;
}

int ftruncate64(int fd, off_t length) {
    REAL(ftruncate64);
    int result = real_ftruncate64(fd, length);
    int saved = errno;
    traced_truncate(fd, length, result);
    errno = saved;
    return result;
}

// A sync is ticketed once it returned: what was written before it began is on disk by then.
static void traced_sync(const char *op, int fd, int result) {
    if (is_tracked(fd)) record_simple(op, fd, result, NULL, NULL);
}

int fsync(int fd) {
    REAL(fsync);
    int result = real_fsync(fd);
    int saved = errno;
    traced_sync("fsync", fd, result);
    errno = saved;
    return result;
}

int fdatasync(int fd) {
    REAL(fdatasync);
    int result = real_fdatasync(fd);
    int saved = errno;
    traced_sync("fdatasync", fd, result);
    errno = saved;
    return result;
}

// sync_file_range makes no promise about durability (no metadata, no device cache): logged, and
// the replayer treats it as no sync at all.
int sync_file_range(int fd, off_t offset, off_t count, unsigned int flags) {
    REAL(sync_file_range);
    int result = real_sync_file_range(fd, offset, count, flags);
    int saved = errno;
    traced_sync("syncrange", fd, result);
    errno = saved;
    return result;
}

static void traced_unlink(int dirfd, const char *path, int result) {
    char buffer[PATH_MAX];
    const char *name = result == 0 ? watched_name(dirfd, path, buffer) : NULL;
    if (name) record_simple("unlink", -1, 0, name, NULL);
}

int unlink(const char *path) {
    REAL(unlink);
    int result = real_unlink(path);
    int saved = errno;
    traced_unlink(AT_FDCWD, path, result);
    errno = saved;
    return result;
}

int unlinkat(int dirfd, const char *path, int flags) {
    REAL(unlinkat);
    // Resolved before the call: a relative path through `dirfd` must still resolve.
    char buffer[PATH_MAX];
    const char *name = watched_name(dirfd, path, buffer);
    int result = real_unlinkat(dirfd, path, flags);
    int saved = errno;
    if (result == 0 && name) record_simple("unlink", -1, 0, name, NULL);
    errno = saved;
    return result;
}

static void traced_rename(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int result) {
    if (result != 0) return;
    char oldbuffer[PATH_MAX], newbuffer[PATH_MAX];
    const char *from = watched_name(olddirfd, oldpath, oldbuffer);
    const char *to = watched_name(newdirfd, newpath, newbuffer);
    // Into the directory from elsewhere is a creation of `to`; out of it, an unlink of `from`.
    if (from && to) {
        record_simple("rename", -1, 0, from, to);
    } else if (to) {
        record_simple("arrive", -1, 0, to, NULL);
    } else if (from) {
        record_simple("unlink", -1, 0, from, NULL);
    }
}

int rename(const char *oldpath, const char *newpath) {
    REAL(rename);
    int result = real_rename(oldpath, newpath);
    int saved = errno;
    traced_rename(AT_FDCWD, oldpath, AT_FDCWD, newpath, result);
    errno = saved;
    return result;
}

int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath) {
    REAL(renameat);
    int result = real_renameat(olddirfd, oldpath, newdirfd, newpath);
    int saved = errno;
    traced_rename(olddirfd, oldpath, newdirfd, newpath, result);
    errno = saved;
    return result;
}

int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags) {
    REAL(renameat2);
    int result = real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
    int saved = errno;
    traced_rename(olddirfd, oldpath, newdirfd, newpath, result);
    errno = saved;
    return result;
}
