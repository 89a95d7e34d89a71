#ifndef IETFPEER_CRYPTO_SHIM_H
#define IETFPEER_CRYPTO_SHIM_H
#include <openssl/evp.h>

/// A SHA-256 context, or NULL.
static inline EVP_MD_CTX *peer_sha256_new(void) {
    EVP_MD_CTX *context = EVP_MD_CTX_new();
    if (context != NULL && EVP_DigestInit_ex(context, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(context);
        return NULL;
    }
    return context;
}
#endif
