#ifndef BACKHAUL_COPENSSL_SHIM_H
#define BACKHAUL_COPENSSL_SHIM_H
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/crypto.h>

/// HMAC-SHA256 in one call; writes 32 bytes to `out`. Returns 1 on success.
static inline int bh_hmac_sha256(const void *key, int key_length, const unsigned char *data, size_t data_length,
                                 unsigned char *out) {
    unsigned int length = 0;
    return HMAC(EVP_sha256(), key, key_length, data, data_length, out, &length) != NULL && length == 32;
}

/// A SHA-256 context (EVP_MD_CTX with EVP_sha256), for digests computed while reading.
static inline EVP_MD_CTX *bh_sha256_new(void) {
    EVP_MD_CTX *context = EVP_MD_CTX_new();
    if (context != NULL && EVP_DigestInit_ex(context, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(context);
        return NULL;
    }
    return context;
}
#endif
