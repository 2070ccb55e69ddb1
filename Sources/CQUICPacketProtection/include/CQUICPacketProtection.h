// QUIC packet protection with BoringSSL (the copy swift-crypto builds), for the QUIC engine.
//
// ngtcp2_crypto_gnutls protects every packet with GnuTLS's AEAD (nettle: AES-NI and PCLMUL,
// about 0.4 µs per 1.4 KB packet here). BoringSSL's AES-GCM uses VAES and AVX-512 where the CPU
// has them, several times faster per packet. GnuTLS keeps the handshake: it still produces the
// traffic secrets, and this backend only turns them into keys of its own and uses them.
#ifndef CQUIC_PACKET_PROTECTION_H
#define CQUIC_PACKET_PROTECTION_H

#include <CNGTCP2.h>

/// The backend as the engine takes it (see cngtcp2_packet_protection in CNGTCP2.h): its
/// set_callbacks replaces ngtcp2_crypto_gnutls's packet-protection callbacks (initial keys,
/// Retry, version negotiation, key update, AEAD, header protection, freeing keys) and keeps the
/// handshake ones; its configure_session routes the TLS session's traffic secrets to its keys.
const cngtcp2_packet_protection *cquic_packet_protection_boringssl(void);

#endif
