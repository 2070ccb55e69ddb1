// C shims for ngtcp2 0.12.1, its GnuTLS crypto helper and GnuTLS.
//
// Swift cannot call function-like macros, so each macro the engine needs is
// wrapped here as a prefixed static inline function (as swift-nio's CNIOLinux does).
#ifndef CNGTCP2_H
#define CNGTCP2_H

#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <gnutls/gnutls.h>
#include <gnutls/crypto.h>
#include <gnutls/x509.h>
#include <sys/socket.h>
#include <netinet/in.h>

/// The version string of the ngtcp2 library this module was compiled against.
static inline const char *cngtcp2_header_version(void) { return NGTCP2_VERSION; }

static inline void cngtcp2_settings_default(ngtcp2_settings *settings) {
  ngtcp2_settings_default(settings);
}

static inline void cngtcp2_transport_params_default(ngtcp2_transport_params *params) {
  ngtcp2_transport_params_default(params);
}

static inline int cngtcp2_conn_client_new(
    ngtcp2_conn **pconn, const ngtcp2_cid *dcid, const ngtcp2_cid *scid,
    const ngtcp2_path *path, uint32_t client_chosen_version,
    const ngtcp2_callbacks *callbacks, const ngtcp2_settings *settings,
    const ngtcp2_transport_params *params, const ngtcp2_mem *mem, void *user_data) {
  return ngtcp2_conn_client_new(pconn, dcid, scid, path, client_chosen_version,
                                callbacks, settings, params, mem, user_data);
}

static inline int cngtcp2_conn_server_new(
    ngtcp2_conn **pconn, const ngtcp2_cid *dcid, const ngtcp2_cid *scid,
    const ngtcp2_path *path, uint32_t client_chosen_version,
    const ngtcp2_callbacks *callbacks, const ngtcp2_settings *settings,
    const ngtcp2_transport_params *params, const ngtcp2_mem *mem, void *user_data) {
  return ngtcp2_conn_server_new(pconn, dcid, scid, path, client_chosen_version,
                                callbacks, settings, params, mem, user_data);
}

static inline int cngtcp2_conn_read_pkt(ngtcp2_conn *conn, const ngtcp2_path *path,
                                        const ngtcp2_pkt_info *pi, const uint8_t *pkt,
                                        size_t pktlen, ngtcp2_tstamp ts) {
  return ngtcp2_conn_read_pkt(conn, path, pi, pkt, pktlen, ts);
}

static inline ngtcp2_ssize cngtcp2_conn_writev_stream(
    ngtcp2_conn *conn, ngtcp2_path *path, ngtcp2_pkt_info *pi, uint8_t *dest,
    size_t destlen, ngtcp2_ssize *pdatalen, uint32_t flags, int64_t stream_id,
    const ngtcp2_vec *datav, size_t datavcnt, ngtcp2_tstamp ts) {
  return ngtcp2_conn_writev_stream(conn, path, pi, dest, destlen, pdatalen, flags,
                                   stream_id, datav, datavcnt, ts);
}

static inline ngtcp2_ssize cngtcp2_conn_writev_datagram(
    ngtcp2_conn *conn, ngtcp2_path *path, ngtcp2_pkt_info *pi, uint8_t *dest,
    size_t destlen, int *paccepted, uint32_t flags, uint64_t dgram_id,
    const ngtcp2_vec *datav, size_t datavcnt, ngtcp2_tstamp ts) {
  return ngtcp2_conn_writev_datagram(conn, path, pi, dest, destlen, paccepted, flags,
                                     dgram_id, datav, datavcnt, ts);
}

static inline ngtcp2_ssize cngtcp2_conn_write_connection_close(
    ngtcp2_conn *conn, ngtcp2_path *path, ngtcp2_pkt_info *pi, uint8_t *dest,
    size_t destlen, const ngtcp2_connection_close_error *ccerr, ngtcp2_tstamp ts) {
  return ngtcp2_conn_write_connection_close(conn, path, pi, dest, destlen, ccerr, ts);
}

static inline void cngtcp2_conn_get_conn_stat(ngtcp2_conn *conn, ngtcp2_conn_stat *cstat) {
  ngtcp2_conn_get_conn_stat(conn, cstat);
}

/// Installs ngtcp2_crypto's GnuTLS-backed callbacks (keys, AEAD, header
/// protection, retry, path challenge data, version negotiation) into |cb|.
/// The application callbacks are set from Swift afterwards.
static inline void cngtcp2_callbacks_set_crypto(ngtcp2_callbacks *cb, int is_server) {
  if (is_server) {
    cb->recv_client_initial = ngtcp2_crypto_recv_client_initial_cb;
  } else {
    cb->client_initial = ngtcp2_crypto_client_initial_cb;
    cb->recv_retry = ngtcp2_crypto_recv_retry_cb;
  }
  cb->recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
  cb->encrypt = ngtcp2_crypto_encrypt_cb;
  cb->decrypt = ngtcp2_crypto_decrypt_cb;
  cb->hp_mask = ngtcp2_crypto_hp_mask_cb;
  cb->update_key = ngtcp2_crypto_update_key_cb;
  cb->delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
  cb->delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
  cb->get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
  cb->version_negotiation = ngtcp2_crypto_version_negotiation_cb;
}

/// A packet-protection backend the engine can use instead of ngtcp2_crypto_gnutls's own
/// (QXferQUIC hands it BoringSSL's, CQUICPacketProtection): |set_callbacks| runs after
/// cngtcp2_callbacks_set_crypto and replaces the callbacks that make and use packet keys;
/// |configure_session| runs after ngtcp2_crypto_gnutls_configure_*_session and routes the TLS
/// session's traffic secrets to that backend. The handshake itself stays GnuTLS's.
typedef struct cngtcp2_packet_protection {
  void (*set_callbacks)(ngtcp2_callbacks *cb, int is_server);
  int (*configure_session)(gnutls_session_t session);
} cngtcp2_packet_protection;

static inline void cngtcp2_packet_protection_set_callbacks(const cngtcp2_packet_protection *backend,
                                                           ngtcp2_callbacks *cb, int is_server) {
  backend->set_callbacks(cb, is_server);
}

static inline int cngtcp2_packet_protection_configure_session(const cngtcp2_packet_protection *backend,
                                                              gnutls_session_t session) {
  return backend->configure_session(session);
}

/// Frees memory that GnuTLS allocated (gnutls_free is a macro over a
/// function pointer variable).
static inline void cngtcp2_gnutls_free(void *p) { gnutls_free(p); }

/// GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), for key generation.
static inline unsigned int cngtcp2_gnutls_p256_bits(void) {
  return GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1);
}

/// Sizes Swift cannot spell portably.
static inline size_t cngtcp2_sizeof_sockaddr_in(void) { return sizeof(struct sockaddr_in); }
static inline size_t cngtcp2_sizeof_sockaddr_in6(void) { return sizeof(struct sockaddr_in6); }

/// Creates a P-256 private key and a self-signed certificate for |common_name|
/// valid for |days| days, both as PEM ("CERTIFICATE" and PKCS#8 "PRIVATE KEY").
/// The outputs are allocated by GnuTLS; free them with cngtcp2_gnutls_free.
/// Returns 0 or a negative GnuTLS error code. Used by tests and tools.
int cngtcp2_generate_self_signed_p256(const char *common_name, unsigned int days,
                                      gnutls_datum_t *cert_pem,
                                      gnutls_datum_t *key_pem);

#endif
