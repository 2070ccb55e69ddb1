#include "CP256.h"

#include <dlfcn.h>
#include <pthread.h>

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/obj_mac.h>
#include <openssl/rand.h>

// libcrypto is loaded when a pairing first needs it, not linked: a linked library is loaded
// and bound (OpenSSL's is built with BIND_NOW) at the start of every qxfer command, ~1.4 ms of
// each start on a slow machine, for the one command that pairs (docs/benchmarks.md, "Process
// start without Foundation").
#define CP256_LIBCRYPTO_FUNCTIONS(F) \
    F(EC_GROUP_new_by_curve_name) F(EC_GROUP_free) F(EC_GROUP_get0_order) \
    F(EC_POINT_new) F(EC_POINT_free) F(EC_POINT_oct2point) F(EC_POINT_point2oct) \
    F(EC_POINT_is_at_infinity) F(EC_POINT_mul) F(EC_POINT_invert) F(EC_POINT_add) \
    F(BN_CTX_new) F(BN_CTX_free) F(BN_new) F(BN_clear_free) F(BN_bin2bn) F(BN_bn2binpad) \
    F(BN_set_flags) F(BN_nnmod) F(BN_priv_rand_range) F(BN_is_zero)

#define CP256_DECLARE(name) __typeof__(&name) name;
static struct { CP256_LIBCRYPTO_FUNCTIONS(CP256_DECLARE) } libcrypto;
static int libcrypto_loaded;
static pthread_once_t libcrypto_once = PTHREAD_ONCE_INIT;

static void load_libcrypto(void) {
    void *library = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) return;
    int complete = 1;
#define CP256_RESOLVE(name) \
    libcrypto.name = (__typeof__(&name))dlsym(library, #name); \
    complete = complete && libcrypto.name != NULL;
    CP256_LIBCRYPTO_FUNCTIONS(CP256_RESOLVE)
    libcrypto_loaded = complete;
}

int cp256_available(void) {
    pthread_once(&libcrypto_once, load_libcrypto);
    return libcrypto_loaded;
}

// From here on every libcrypto call goes through the table.
#define EC_GROUP_new_by_curve_name libcrypto.EC_GROUP_new_by_curve_name
#define EC_GROUP_free libcrypto.EC_GROUP_free
#define EC_GROUP_get0_order libcrypto.EC_GROUP_get0_order
#define EC_POINT_new libcrypto.EC_POINT_new
#define EC_POINT_free libcrypto.EC_POINT_free
#define EC_POINT_oct2point libcrypto.EC_POINT_oct2point
#define EC_POINT_point2oct libcrypto.EC_POINT_point2oct
#define EC_POINT_is_at_infinity libcrypto.EC_POINT_is_at_infinity
#define EC_POINT_mul libcrypto.EC_POINT_mul
#define EC_POINT_invert libcrypto.EC_POINT_invert
#define EC_POINT_add libcrypto.EC_POINT_add
#define BN_CTX_new libcrypto.BN_CTX_new
#define BN_CTX_free libcrypto.BN_CTX_free
#define BN_new libcrypto.BN_new
#define BN_clear_free libcrypto.BN_clear_free
#define BN_bin2bn libcrypto.BN_bin2bn
#define BN_bn2binpad libcrypto.BN_bn2binpad
#define BN_set_flags libcrypto.BN_set_flags
#define BN_nnmod libcrypto.BN_nnmod
#define BN_priv_rand_range libcrypto.BN_priv_rand_range
#define BN_is_zero libcrypto.BN_is_zero

// One group per call keeps this free of global state; the cost is negligible next to the
// network round trips of a pairing.
typedef struct {
    EC_GROUP *group;
    BN_CTX *ctx;
} context;

static int begin(context *c) {
    c->group = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1);
    c->ctx = BN_CTX_new();
    return c->group != NULL && c->ctx != NULL;
}

static void end(context *c) {
    BN_CTX_free(c->ctx);
    EC_GROUP_free(c->group);
}

static BIGNUM *scalar(const uint8_t bytes[CP256_SCALAR_BYTES]) {
    BIGNUM *value = BN_bin2bn(bytes, CP256_SCALAR_BYTES, NULL);
    if (value) BN_set_flags(value, BN_FLG_CONSTTIME);
    return value;
}

static EC_POINT *point(context *c, const uint8_t *bytes, size_t length) {
    EC_POINT *p = EC_POINT_new(c->group);
    // oct2point checks that the point is on the curve; P-256 has cofactor 1, so every point
    // on it is in the prime-order group and only the identity needs refusing.
    if (p == NULL || EC_POINT_oct2point(c->group, p, bytes, length, c->ctx) != 1
        || EC_POINT_is_at_infinity(c->group, p)) {
        EC_POINT_free(p);
        return NULL;
    }
    return p;
}

static int encode(context *c, const EC_POINT *p, uint8_t out[CP256_POINT_BYTES]) {
    if (EC_POINT_is_at_infinity(c->group, p)) return 0;
    return EC_POINT_point2oct(c->group, p, POINT_CONVERSION_UNCOMPRESSED, out, CP256_POINT_BYTES, c->ctx)
        == CP256_POINT_BYTES;
}

int cp256_reduce(const uint8_t *wide, size_t wide_len, uint8_t out[CP256_SCALAR_BYTES]) {
    if (!cp256_available()) return 0;
    context c;
    int ok = 0;
    BIGNUM *value = NULL, *reduced = NULL;
    if (!begin(&c)) goto done;
    value = BN_bin2bn(wide, (int)wide_len, NULL);
    reduced = BN_new();
    if (value && reduced && BN_nnmod(reduced, value, EC_GROUP_get0_order(c.group), c.ctx) == 1)
        ok = BN_bn2binpad(reduced, out, CP256_SCALAR_BYTES) == CP256_SCALAR_BYTES;
done:
    BN_clear_free(value);
    BN_clear_free(reduced);
    end(&c);
    return ok;
}

int cp256_random_scalar(uint8_t out[CP256_SCALAR_BYTES]) {
    if (!cp256_available()) return 0;
    context c;
    int ok = 0;
    BIGNUM *value = BN_new();
    if (!begin(&c) || value == NULL) goto done;
    // BN_priv_rand_range draws uniformly from [0, n); retry the negligible zero.
    do {
        if (BN_priv_rand_range(value, EC_GROUP_get0_order(c.group)) != 1) goto done;
    } while (BN_is_zero(value));
    ok = BN_bn2binpad(value, out, CP256_SCALAR_BYTES) == CP256_SCALAR_BYTES;
done:
    BN_clear_free(value);
    end(&c);
    return ok;
}

int cp256_share(const uint8_t s[CP256_SCALAR_BYTES], const uint8_t w[CP256_SCALAR_BYTES],
                const uint8_t base[CP256_POINT_BYTES], uint8_t out[CP256_POINT_BYTES]) {
    if (!cp256_available()) return 0;
    context c;
    int ok = 0;
    BIGNUM *sv = scalar(s), *wv = scalar(w);
    EC_POINT *b = NULL, *result = NULL;
    if (!begin(&c) || !sv || !wv) goto done;
    b = point(&c, base, CP256_POINT_BYTES);
    result = EC_POINT_new(c.group);
    if (b && result && EC_POINT_mul(c.group, result, sv, b, wv, c.ctx) == 1)
        ok = encode(&c, result, out);
done:
    EC_POINT_free(b);
    EC_POINT_free(result);
    BN_clear_free(sv);
    BN_clear_free(wv);
    end(&c);
    return ok;
}

int cp256_shared_point(const uint8_t s[CP256_SCALAR_BYTES], const uint8_t w[CP256_SCALAR_BYTES],
                       const uint8_t base[CP256_POINT_BYTES], const uint8_t peer[CP256_POINT_BYTES],
                       uint8_t out[CP256_POINT_BYTES]) {
    if (!cp256_available()) return 0;
    context c;
    int ok = 0;
    BIGNUM *sv = scalar(s), *wv = scalar(w);
    EC_POINT *b = NULL, *p = NULL, *blinding = NULL, *result = NULL;
    if (!begin(&c) || !sv || !wv) goto done;
    b = point(&c, base, CP256_POINT_BYTES);
    p = point(&c, peer, CP256_POINT_BYTES);
    blinding = EC_POINT_new(c.group);
    result = EC_POINT_new(c.group);
    if (!b || !p || !blinding || !result) goto done;
    // peer - w*base, then times the own secret scalar.
    if (EC_POINT_mul(c.group, blinding, NULL, b, wv, c.ctx) != 1
        || EC_POINT_invert(c.group, blinding, c.ctx) != 1
        || EC_POINT_add(c.group, p, p, blinding, c.ctx) != 1
        || EC_POINT_is_at_infinity(c.group, p)
        || EC_POINT_mul(c.group, result, NULL, p, sv, c.ctx) != 1)
        goto done;
    ok = encode(&c, result, out);
done:
    EC_POINT_free(b);
    EC_POINT_free(p);
    EC_POINT_free(blinding);
    EC_POINT_free(result);
    BN_clear_free(sv);
    BN_clear_free(wv);
    end(&c);
    return ok;
}

int cp256_decompress(const uint8_t *in, size_t in_len, uint8_t out[CP256_POINT_BYTES]) {
    if (!cp256_available()) return 0;
    context c;
    int ok = 0;
    EC_POINT *p = NULL;
    if (!begin(&c)) goto done;
    p = point(&c, in, in_len);
    if (p) ok = encode(&c, p, out);
done:
    EC_POINT_free(p);
    end(&c);
    return ok;
}
