#ifndef BACKHAUL_CGLIBC_SHIM_H
#define BACKHAUL_CGLIBC_SHIM_H
// What the C library has and Swift's Glibc module does not bring in.
#include <malloc.h>
#include <sys/random.h>
#include <sys/types.h>

/// getrandom(2): fills `length` bytes from the kernel's generator, or returns -1 (errno set).
static inline ssize_t bh_getrandom(void *buffer, size_t length) {
    return getrandom(buffer, length, 0);
}

#endif
