#ifndef BACKHAUL_CCURL_SHIM_H
#define BACKHAUL_CCURL_SHIM_H
#include <curl/curl.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

/* curl_easy_setopt / curl_multi_setopt / curl_easy_getinfo are variadic: typed wrappers. */

static inline CURLcode bh_curl_easy_setopt_long(CURL *handle, CURLoption option, long value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode bh_curl_easy_setopt_off_t(CURL *handle, CURLoption option, curl_off_t value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode bh_curl_easy_setopt_string(CURL *handle, CURLoption option, const char *value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode bh_curl_easy_setopt_ptr(CURL *handle, CURLoption option, void *value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode bh_curl_easy_setopt_slist(CURL *handle, CURLoption option, struct curl_slist *value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode bh_curl_easy_setopt_mime(CURL *handle, curl_mime *value) {
    return curl_easy_setopt(handle, CURLOPT_MIMEPOST, value);
}

typedef size_t (*bh_curl_data_callback)(char *buffer, size_t size, size_t count, void *userdata);
typedef int (*bh_curl_xferinfo_callback)(void *userdata, curl_off_t dltotal, curl_off_t dlnow,
                                         curl_off_t ultotal, curl_off_t ulnow);

/// Sets a data callback and its userdata in one call (read, write or header).
static inline CURLcode bh_curl_easy_set_data_callback(CURL *handle, CURLoption function_option,
                                                      CURLoption data_option,
                                                      bh_curl_data_callback callback, void *userdata) {
    CURLcode code = curl_easy_setopt(handle, function_option, callback);
    if (code != CURLE_OK) return code;
    return curl_easy_setopt(handle, data_option, userdata);
}
static inline CURLcode bh_curl_easy_set_xferinfo_callback(CURL *handle, bh_curl_xferinfo_callback callback,
                                                          void *userdata) {
    CURLcode code = curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, callback);
    if (code != CURLE_OK) return code;
    code = curl_easy_setopt(handle, CURLOPT_XFERINFODATA, userdata);
    if (code != CURLE_OK) return code;
    return curl_easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
}

typedef int (*bh_curl_seek_callback)(void *userdata, curl_off_t offset, int origin);

/// Sets the seek callback and its userdata (curl rewinds bodies through it).
static inline CURLcode bh_curl_easy_set_seek_callback(CURL *handle, bh_curl_seek_callback callback, void *userdata) {
    CURLcode code = curl_easy_setopt(handle, CURLOPT_SEEKFUNCTION, callback);
    if (code != CURLE_OK) return code;
    return curl_easy_setopt(handle, CURLOPT_SEEKDATA, userdata);
}
static inline int bh_curl_seekfunc_ok(void) { return CURL_SEEKFUNC_OK; }
static inline int bh_curl_seekfunc_cantseek(void) { return CURL_SEEKFUNC_CANTSEEK; }

typedef int (*bh_curl_trailer_callback)(struct curl_slist **list, void *userdata);

/// Sets the trailer callback and its userdata (chunked uploads send trailers after the body).
static inline CURLcode bh_curl_easy_set_trailer_callback(CURL *handle, bh_curl_trailer_callback callback, void *userdata) {
    CURLcode code = curl_easy_setopt(handle, CURLOPT_TRAILERFUNCTION, callback);
    if (code != CURLE_OK) return code;
    return curl_easy_setopt(handle, CURLOPT_TRAILERDATA, userdata);
}
static inline int bh_curl_trailerfunc_ok(void) { return CURL_TRAILERFUNC_OK; }

static inline CURLcode bh_curl_easy_getinfo_long(CURL *handle, CURLINFO info, long *value) {
    return curl_easy_getinfo(handle, info, value);
}
static inline CURLcode bh_curl_easy_getinfo_off_t(CURL *handle, CURLINFO info, curl_off_t *value) {
    return curl_easy_getinfo(handle, info, value);
}
static inline CURLcode bh_curl_easy_getinfo_ptr(CURL *handle, CURLINFO info, void **value) {
    return curl_easy_getinfo(handle, info, value);
}

static inline CURLMcode bh_curl_multi_setopt_long(CURLM *multi, CURLMoption option, long value) {
    return curl_multi_setopt(multi, option, value);
}

/// CURLOPT_PREREQFUNCTION: called once connected, before the request is sent, with the peer's IP.
typedef int (*bh_curl_prereq_callback)(void *userdata, char *primary_ip, char *local_ip, int primary_port, int local_port);
static inline CURLcode bh_curl_easy_set_prereq_callback(CURL *handle, bh_curl_prereq_callback callback, void *userdata) {
    CURLcode result = curl_easy_setopt(handle, CURLOPT_PREREQFUNCTION, callback);
    if (result != CURLE_OK) return result;
    return curl_easy_setopt(handle, CURLOPT_PREREQDATA, userdata);
}

/// CURLOPT_SOCKOPTFUNCTION: called with each new socket before it connects.
typedef int (*bh_curl_sockopt_callback)(void *userdata, curl_socket_t socket, curlsocktype purpose);
static inline CURLcode bh_curl_easy_set_sockopt_callback(CURL *handle, bh_curl_sockopt_callback callback, void *userdata) {
    CURLcode result = curl_easy_setopt(handle, CURLOPT_SOCKOPTFUNCTION, callback);
    if (result != CURLE_OK) return result;
    return curl_easy_setopt(handle, CURLOPT_SOCKOPTDATA, userdata);
}
static inline int bh_curl_sockopt_ok(void) { return CURL_SOCKOPT_OK; }

/* TCP_INFO of a socket: the fields a pacer reads. glibc's <netinet/tcp.h> declares an older
   struct tcp_info (no tcpi_notsent_bytes, tcpi_min_rtt, tcpi_delivery_rate) and <linux/tcp.h>
   cannot sit beside it in one module, so the kernel's layout (<linux/tcp.h>, stable ABI) is
   copied here, up to tcpi_delivery_rate; an older kernel fills less and the rest reads 0. */
struct bh_tcp_info {
    uint8_t state, ca_state, retransmits, probes, backoff, options, wscale, rate_flags;
    uint32_t rto, ato, snd_mss, rcv_mss;
    uint32_t unacked, sacked, lost, retrans, fackets;
    uint32_t last_data_sent, last_ack_sent, last_data_recv, last_ack_recv;
    uint32_t pmtu, rcv_ssthresh, rtt, rttvar, snd_ssthresh, snd_cwnd, advmss, reordering;
    uint32_t rcv_rtt, rcv_space;
    uint32_t total_retrans;
    uint64_t pacing_rate, max_pacing_rate, bytes_acked, bytes_received;
    uint32_t segs_out, segs_in;
    uint32_t notsent_bytes, min_rtt, data_segs_in, data_segs_out;
    uint64_t delivery_rate;
};
static inline int bh_tcp_info_read(int fd, struct bh_tcp_info *out) {
    socklen_t length = sizeof *out;
    memset(out, 0, sizeof *out);
    return getsockopt(fd, IPPROTO_TCP, TCP_INFO, out, &length);
}
/* setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, bytes/s): TCP paces the socket itself. */
static inline int bh_socket_set_max_pacing_rate(int fd, unsigned int bytes_per_second) {
    return setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &bytes_per_second, sizeof bytes_per_second);
}
/* setsockopt(fd, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, 1): a thin stream's retransmission
   timeouts do not back off exponentially for the first six. */
static inline int bh_tcp_set_thin_linear_timeouts(int fd) {
    int on = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, &on, sizeof on);
}
/* setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, bytes). */
static inline int bh_tcp_set_notsent_lowat(int fd, int bytes) {
    return setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &bytes, sizeof bytes);
}

/* CURLINFO_ACTIVESOCKET: the transfer's socket (CURL_SOCKET_BAD, -1, when none). */
static inline CURLcode bh_curl_easy_getinfo_socket(CURL *handle, curl_socket_t *value) {
    return curl_easy_getinfo(handle, CURLINFO_ACTIVESOCKET, value);
}

/* CURLMsg has a union; read its fields here. */
static inline CURL *bh_curl_msg_easy_handle(CURLMsg *msg) { return msg->easy_handle; }
static inline int bh_curl_msg_is_done(CURLMsg *msg) { return msg->msg == CURLMSG_DONE; }
static inline CURLcode bh_curl_msg_result(CURLMsg *msg) { return msg->data.result; }

static inline size_t bh_curl_readfunc_abort(void) { return CURL_READFUNC_ABORT; }
static inline size_t bh_curl_readfunc_pause(void) { return CURL_READFUNC_PAUSE; }

/// curl_mime_data_cb with read and seek callbacks (no free callback: the owner outlives the part).
static inline CURLcode bh_curl_mime_data_cb(curl_mimepart *part, curl_off_t size,
                                            bh_curl_data_callback read_callback,
                                            bh_curl_seek_callback seek_callback, void *userdata) {
    return curl_mime_data_cb(part, size, (curl_read_callback)read_callback, (curl_seek_callback)seek_callback, NULL,
                             userdata);
}
#endif
