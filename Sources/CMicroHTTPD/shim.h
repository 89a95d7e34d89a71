#ifndef BACKHAUL_CMICROHTTPD_SHIM_H
#define BACKHAUL_CMICROHTTPD_SHIM_H
#include <sys/types.h>
#include <sys/socket.h>
#include <stdint.h>
#include <stdarg.h>
#include <microhttpd.h>

typedef enum MHD_Result (*bh_mhd_access_handler)(void *cls, struct MHD_Connection *connection,
                                                  const char *url, const char *method,
                                                  const char *version, const char *upload_data,
                                                  size_t *upload_data_size, void **con_cls);
typedef void (*bh_mhd_completed_handler)(void *cls, struct MHD_Connection *connection,
                                         void **con_cls, enum MHD_RequestTerminationCode toe);

/// MHD_start_daemon is variadic: start with a fixed option set through MHD_OPTION_ARRAY.
static inline struct MHD_Daemon *bh_mhd_start(unsigned int flags, uint16_t port,
                                              const struct sockaddr *address,
                                              unsigned int thread_pool_size,
                                              unsigned int connection_timeout,
                                              unsigned int connection_limit,
                                              bh_mhd_access_handler handler,
                                              bh_mhd_completed_handler completed, void *cls) {
    struct MHD_OptionItem options[] = {
        {MHD_OPTION_SOCK_ADDR, 0, (void *)address},
        {MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)connection_timeout, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)connection_limit, NULL},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed, cls},
        {thread_pool_size > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, (intptr_t)thread_pool_size, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    return MHD_start_daemon(flags, port, NULL, NULL, handler, cls, MHD_OPTION_ARRAY, options, MHD_OPTION_END);
}

/// The port the daemon is bound to (useful when asked for port 0).
static inline uint16_t bh_mhd_bound_port(struct MHD_Daemon *daemon) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info == NULL ? 0 : info->port;
}

typedef enum MHD_Result (*bh_mhd_key_value_iterator)(void *cls, enum MHD_ValueKind kind, const char *key,
                                                     const char *value);
typedef ssize_t (*bh_mhd_content_reader)(void *cls, uint64_t pos, char *buf, size_t max);
typedef void (*bh_mhd_content_reader_free)(void *cls);

static inline ssize_t bh_mhd_content_reader_end_of_stream(void) { return MHD_CONTENT_READER_END_OF_STREAM; }
static inline ssize_t bh_mhd_content_reader_end_with_error(void) { return MHD_CONTENT_READER_END_WITH_ERROR; }
static inline uint64_t bh_mhd_size_unknown(void) { return MHD_SIZE_UNKNOWN; }
#endif
