// P-256 group operations for SPAKE2 (RFC 9382), from OpenSSL's libcrypto (Debian's libssl-dev),
// loaded on first use (libcrypto.so.3): every function fails while it cannot be loaded.
//
// Only what the PAKE needs, with fixed-size buffers: 32-byte big-endian scalars, 65-byte
// uncompressed points (SEC1, 0x04 || x || y). Every point read from the network is decoded
// with a full on-curve check and refused when it is the identity. Functions return 1 on
// success and 0 on any failure (bad encoding, point not on the curve, identity result).
#ifndef CP256_H
#define CP256_H

#include <stddef.h>
#include <stdint.h>

enum { CP256_SCALAR_BYTES = 32, CP256_POINT_BYTES = 65 };

/// 1 once libcrypto is loaded (the first call loads it), 0 if it cannot be.
int cp256_available(void);

/// out = (wide mod n): reduces a big-endian integer of any length modulo the group order,
/// as RFC 9382 derives w from a hash longer than the order to remove bias.
int cp256_reduce(const uint8_t *wide, size_t wide_len, uint8_t out[CP256_SCALAR_BYTES]);

/// out = a uniformly random scalar in [1, n).
int cp256_random_scalar(uint8_t out[CP256_SCALAR_BYTES]);

/// out = scalar*G + w*base, where base is 65 bytes (M or N). The public share of SPAKE2.
int cp256_share(const uint8_t scalar[CP256_SCALAR_BYTES], const uint8_t w[CP256_SCALAR_BYTES],
                const uint8_t base[CP256_POINT_BYTES], uint8_t out[CP256_POINT_BYTES]);

/// out = scalar*(peer - w*base): the shared point K. Fails if `peer` is not a valid point
/// other than the identity, or if K is the identity.
int cp256_shared_point(const uint8_t scalar[CP256_SCALAR_BYTES], const uint8_t w[CP256_SCALAR_BYTES],
                       const uint8_t base[CP256_POINT_BYTES], const uint8_t peer[CP256_POINT_BYTES],
                       uint8_t out[CP256_POINT_BYTES]);

/// out = the uncompressed form of a compressed (33-byte) or uncompressed point, validated.
int cp256_decompress(const uint8_t *in, size_t in_len, uint8_t out[CP256_POINT_BYTES]);

#endif
