#ifndef BACKHAUL_CSYSTEMD_SHIM_H
#define BACKHAUL_CSYSTEMD_SHIM_H
#include <systemd/sd-daemon.h>
#include <systemd/sd-bus.h>

/// `SD_BUS_ERROR_NULL` is a compound-literal macro Swift cannot import: a cleared error.
static inline sd_bus_error bh_sd_bus_error_null(void) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    return error;
}

#endif
