#ifndef BACKHAUL_CRANDOM_SHIM_H
#define BACKHAUL_CRANDOM_SHIM_H
#include <sys/random.h>
#include <sys/types.h>

/// getrandom(2) from the C library, which Swift's Glibc module does not bring in: fills `length`
/// bytes from the kernel's generator, or returns -1 (errno set).
static inline ssize_t bh_getrandom(void *buffer, size_t length) {
    return getrandom(buffer, length, 0);
}

#endif
