#ifndef COFFER_CCRYPTO_SHIM_H
#define COFFER_CCRYPTO_SHIM_H
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/core_names.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <openssl/hmac.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/sha.h>

/* OSSL_PARAM_construct_* store the *pointer* to the parameter name (and, for
 * utf8 strings, to the value). Swift string-to-pointer bridging yields
 * temporaries that dangle after the call, so names come from these helpers,
 * which return C string literals with static storage duration. */
static inline const char *coffer_param_digest(void) { return OSSL_KDF_PARAM_DIGEST; }
static inline const char *coffer_param_key(void) { return OSSL_KDF_PARAM_KEY; }
static inline const char *coffer_param_salt(void) { return OSSL_KDF_PARAM_SALT; }
static inline const char *coffer_param_info(void) { return OSSL_KDF_PARAM_INFO; }
/* Only read by OpenSSL when setting parameters; the cast drops const for the API's char*. */
static inline char *coffer_digest_sha256(void) { return (char *)"SHA256"; }
#endif
