// QUIC packet protection (RFC 9001 §5) with BoringSSL's AEAD and block ciphers.
//
// GnuTLS runs the handshake and hands out traffic secrets; ngtcp2_crypto_gnutls would turn
// them into GnuTLS cipher handles. This file takes over from the secret onwards: it derives
// key, IV and header-protection key with ngtcp2's exported HKDF (still GnuTLS's, run a few
// times per connection), makes BoringSSL contexts of them, installs those into the
// connection, and seals, opens and masks every packet with them. The aead, md and hp
// descriptors ngtcp2 keeps stay GnuTLS algorithm identifiers (ngtcp2's HKDF reads them);
// only the contexts are ours, so every callback below sees only contexts made here.
#include "CQUICPacketProtection.h"

#include <CCryptoBoringSSL.h>
#include <stdlib.h>
#include <string.h>

enum {
  INITIAL_SECRET_LENGTH = 32,  // SHA-256
  INITIAL_KEY_LENGTH = 16,     // AES-128-GCM
  MAX_KEY_LENGTH = 32,
  MAX_IV_LENGTH = 16,
  MAX_SECRET_LENGTH = 64,
};

// ---- algorithms -----------------------------------------------------------------------

static const EVP_AEAD *evp_aead(const ngtcp2_crypto_aead *aead) {
  switch ((gnutls_cipher_algorithm_t)(intptr_t)aead->native_handle) {
  case GNUTLS_CIPHER_AES_128_GCM: return EVP_aead_aes_128_gcm();
  case GNUTLS_CIPHER_AES_256_GCM: return EVP_aead_aes_256_gcm();
  case GNUTLS_CIPHER_CHACHA20_POLY1305: return EVP_aead_chacha20_poly1305();
  default: return NULL;  // TLSSession's priority string offers no other suite
  }
}

static size_t aead_key_length(const ngtcp2_crypto_aead *aead) {
  const EVP_AEAD *evp = evp_aead(aead);
  return evp ? EVP_AEAD_key_length(evp) : 0;
}

static void initial_context(ngtcp2_crypto_ctx *ctx) {
  memset(ctx, 0, sizeof(*ctx));
  ctx->aead.native_handle = (void *)(intptr_t)GNUTLS_CIPHER_AES_128_GCM;
  ctx->aead.max_overhead = 16;
  ctx->md.native_handle = (void *)(intptr_t)GNUTLS_DIG_SHA256;
  ctx->hp.native_handle = (void *)(intptr_t)GNUTLS_CIPHER_AES_128_CBC;
}

// Header protection: one AES block, or five bytes of ChaCha20 keystream (RFC 9001 §5.4).
typedef struct {
  int chacha;
  AES_KEY aes;
  uint8_t chacha_key[32];
} header_key;

// ---- contexts -------------------------------------------------------------------------

static int aead_context_init(ngtcp2_crypto_aead_ctx *out, const ngtcp2_crypto_aead *aead,
                             const uint8_t *key) {
  const EVP_AEAD *evp = evp_aead(aead);
  if (!evp) return -1;
  EVP_AEAD_CTX *ctx = EVP_AEAD_CTX_new(evp, key, EVP_AEAD_key_length(evp), EVP_AEAD_DEFAULT_TAG_LENGTH);
  if (!ctx) return -1;
  out->native_handle = ctx;
  return 0;
}

static void aead_context_free(ngtcp2_crypto_aead_ctx *ctx) {
  if (ctx->native_handle) EVP_AEAD_CTX_free(ctx->native_handle);
  ctx->native_handle = NULL;
}

static int header_context_init(ngtcp2_crypto_cipher_ctx *out, const ngtcp2_crypto_cipher *hp,
                               const uint8_t *key) {
  header_key *hk = calloc(1, sizeof(*hk));
  if (!hk) return -1;
  switch ((gnutls_cipher_algorithm_t)(intptr_t)hp->native_handle) {
  case GNUTLS_CIPHER_AES_128_CBC:
  case GNUTLS_CIPHER_AES_256_CBC: {
    unsigned bits = (gnutls_cipher_algorithm_t)(intptr_t)hp->native_handle == GNUTLS_CIPHER_AES_128_CBC ? 128 : 256;
    if (AES_set_encrypt_key(key, bits, &hk->aes) != 0) {
      free(hk);
      return -1;
    }
    break;
  }
  case GNUTLS_CIPHER_CHACHA20_32:
    hk->chacha = 1;
    memcpy(hk->chacha_key, key, sizeof(hk->chacha_key));
    break;
  default:
    free(hk);
    return -1;
  }
  out->native_handle = hk;
  return 0;
}

static void header_context_free(ngtcp2_crypto_cipher_ctx *ctx) {
  if (ctx->native_handle) {
    explicit_bzero(ctx->native_handle, sizeof(header_key));
    free(ctx->native_handle);
  }
  ctx->native_handle = NULL;
}

// ---- per packet -----------------------------------------------------------------------

static int encrypt_packet(uint8_t *dest, const ngtcp2_crypto_aead *aead, const ngtcp2_crypto_aead_ctx *aead_ctx,
                          const uint8_t *plaintext, size_t plaintextlen, const uint8_t *nonce, size_t noncelen,
                          const uint8_t *aad, size_t aadlen) {
  size_t written;
  if (!EVP_AEAD_CTX_seal(aead_ctx->native_handle, dest, &written, plaintextlen + aead->max_overhead, nonce,
                         noncelen, plaintext, plaintextlen, aad, aadlen)) {
    return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  return 0;
}

static int decrypt_packet(uint8_t *dest, const ngtcp2_crypto_aead *aead, const ngtcp2_crypto_aead_ctx *aead_ctx,
                          const uint8_t *ciphertext, size_t ciphertextlen, const uint8_t *nonce, size_t noncelen,
                          const uint8_t *aad, size_t aadlen) {
  size_t written;
  if (ciphertextlen < aead->max_overhead ||
      !EVP_AEAD_CTX_open(aead_ctx->native_handle, dest, &written, ciphertextlen - aead->max_overhead, nonce,
                         noncelen, ciphertext, ciphertextlen, aad, aadlen)) {
    return NGTCP2_ERR_DECRYPT;
  }
  return 0;
}

static int header_mask(uint8_t *dest, const ngtcp2_crypto_cipher *hp, const ngtcp2_crypto_cipher_ctx *hp_ctx,
                       const uint8_t *sample) {
  (void)hp;
  const header_key *hk = hp_ctx->native_handle;
  if (hk->chacha) {
    static const uint8_t zeros[5] = {0};
    uint32_t counter = (uint32_t)sample[0] | (uint32_t)sample[1] << 8 | (uint32_t)sample[2] << 16 |
                       (uint32_t)sample[3] << 24;
    CRYPTO_chacha_20(dest, zeros, sizeof(zeros), hk->chacha_key, sample + 4, counter);
  } else {
    uint8_t block[16];
    AES_encrypt(sample, block, &hk->aes);
    memcpy(dest, block, 5);
  }
  return 0;
}

// ---- deriving and installing keys -----------------------------------------------------

static int derive_packet_keys(uint8_t *key, uint8_t *iv, uint8_t *hp_key, uint32_t version,
                              const ngtcp2_crypto_ctx *ctx, const uint8_t *secret, size_t secretlen) {
  static const uint8_t v1_key[] = "quic key", v1_iv[] = "quic iv", v1_hp[] = "quic hp";
  static const uint8_t v2_key[] = "quicv2 key", v2_iv[] = "quicv2 iv", v2_hp[] = "quicv2 hp";
  int v2 = version == NGTCP2_PROTO_VER_V2_DRAFT;
  size_t keylen = aead_key_length(&ctx->aead);
  size_t ivlen = ngtcp2_crypto_packet_protection_ivlen(&ctx->aead);
  if (keylen == 0 || keylen > MAX_KEY_LENGTH || ivlen > MAX_IV_LENGTH) return -1;
  if (ngtcp2_crypto_hkdf_expand_label(key, keylen, &ctx->md, secret, secretlen, v2 ? v2_key : v1_key,
                                      (v2 ? sizeof(v2_key) : sizeof(v1_key)) - 1) != 0 ||
      ngtcp2_crypto_hkdf_expand_label(iv, ivlen, &ctx->md, secret, secretlen, v2 ? v2_iv : v1_iv,
                                      (v2 ? sizeof(v2_iv) : sizeof(v1_iv)) - 1) != 0) {
    return -1;
  }
  if (hp_key && ngtcp2_crypto_hkdf_expand_label(hp_key, keylen, &ctx->md, secret, secretlen, v2 ? v2_hp : v1_hp,
                                                (v2 ? sizeof(v2_hp) : sizeof(v1_hp)) - 1) != 0) {
    return -1;
  }
  return 0;
}

// One direction's keys of a handshake, 0-RTT or 1-RTT secret (what ngtcp2_crypto's
// derive_and_install_{rx,tx}_key do, with BoringSSL contexts). With GnuTLS the transport
// parameters travel through a TLS extension handler, so there is nothing else to do here.
static int install_traffic_key(ngtcp2_conn *conn, ngtcp2_crypto_level level, int receive,
                               const uint8_t *secret, size_t secretlen) {
  int server = ngtcp2_conn_is_server(conn);
  void *tls = ngtcp2_conn_get_tls_native_handle(conn);
  const ngtcp2_crypto_ctx *ctx;
  ngtcp2_crypto_ctx fresh;
  uint32_t version;

  if (secretlen > MAX_SECRET_LENGTH) return -1;
  if (level == NGTCP2_CRYPTO_LEVEL_EARLY) {
    if (receive != server) return 0;  // 0-RTT keys: the client sends, the server receives
    ngtcp2_crypto_ctx_tls_early(&fresh, tls);
    ngtcp2_conn_set_early_crypto_ctx(conn, &fresh);
    ctx = ngtcp2_conn_get_early_crypto_ctx(conn);
    version = ngtcp2_conn_get_client_chosen_version(conn);
  } else {
    ctx = ngtcp2_conn_get_crypto_ctx(conn);
    version = ngtcp2_conn_get_negotiated_version(conn);
    if (!ctx->aead.native_handle) {
      ngtcp2_crypto_ctx_tls(&fresh, tls);
      ngtcp2_conn_set_crypto_ctx(conn, &fresh);
      ctx = ngtcp2_conn_get_crypto_ctx(conn);
    }
  }

  uint8_t key[MAX_KEY_LENGTH], iv[MAX_IV_LENGTH], hp_key[MAX_KEY_LENGTH];
  ngtcp2_crypto_aead_ctx aead_ctx = {0};
  ngtcp2_crypto_cipher_ctx hp_ctx = {0};
  size_t ivlen = ngtcp2_crypto_packet_protection_ivlen(&ctx->aead);
  int rv = derive_packet_keys(key, iv, hp_key, version, ctx, secret, secretlen);
  if (rv == 0) rv = aead_context_init(&aead_ctx, &ctx->aead, key);
  if (rv == 0) rv = header_context_init(&hp_ctx, &ctx->hp, hp_key);
  if (rv == 0) {
    switch (level) {
    case NGTCP2_CRYPTO_LEVEL_EARLY:
      rv = ngtcp2_conn_install_early_key(conn, &aead_ctx, iv, ivlen, &hp_ctx);
      break;
    case NGTCP2_CRYPTO_LEVEL_HANDSHAKE:
      rv = receive ? ngtcp2_conn_install_rx_handshake_key(conn, &aead_ctx, iv, ivlen, &hp_ctx)
                   : ngtcp2_conn_install_tx_handshake_key(conn, &aead_ctx, iv, ivlen, &hp_ctx);
      break;
    case NGTCP2_CRYPTO_LEVEL_APPLICATION:
      rv = receive ? ngtcp2_conn_install_rx_key(conn, secret, secretlen, &aead_ctx, iv, ivlen, &hp_ctx)
                   : ngtcp2_conn_install_tx_key(conn, secret, secretlen, &aead_ctx, iv, ivlen, &hp_ctx);
      break;
    default:
      rv = -1;
    }
  }
  explicit_bzero(key, sizeof(key));
  explicit_bzero(hp_key, sizeof(hp_key));
  if (rv != 0) {
    header_context_free(&hp_ctx);
    aead_context_free(&aead_ctx);
    return -1;
  }
  return 0;
}

static int secret_func(gnutls_session_t session, gnutls_record_encryption_level_t gtls_level,
                       const void *rx_secret, const void *tx_secret, size_t secretlen) {
  ngtcp2_crypto_conn_ref *conn_ref = gnutls_session_get_ptr(session);
  ngtcp2_conn *conn = conn_ref->get_conn(conn_ref);
  ngtcp2_crypto_level level = ngtcp2_crypto_gnutls_from_gnutls_record_encryption_level(gtls_level);
  if (rx_secret && install_traffic_key(conn, level, 1, rx_secret, secretlen) != 0) return -1;
  if (tx_secret && install_traffic_key(conn, level, 0, tx_secret, secretlen) != 0) return -1;
  return 0;
}

// Initial keys from the client's first destination connection ID (RFC 9001 §5.2); |vneg|
// installs them as the keys of a version chosen by compatible version negotiation.
static int install_initial_keys(ngtcp2_conn *conn, uint32_t version, const ngtcp2_cid *client_dcid, int vneg) {
  static const uint8_t client_label[] = "client in", server_label[] = "server in";
  ngtcp2_crypto_ctx ctx;
  initial_context(&ctx);
  // The initial salts of RFC 9001 §5.2 and of the QUIC v2 draft ngtcp2 0.12 speaks.
  static const uint8_t v1_salt[20] = {0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17,
                                      0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb, 0x7f, 0x0a};
  static const uint8_t v2_draft_salt[20] = {0xa7, 0x07, 0xc2, 0x03, 0xa5, 0x9b, 0x47, 0x18, 0x4a, 0x1d,
                                            0x62, 0xca, 0x57, 0x04, 0x06, 0xea, 0x7a, 0xe3, 0xe5, 0xd3};
  const uint8_t *salt;
  if (version == NGTCP2_PROTO_VER_V1) {
    salt = v1_salt;
  } else if (version == NGTCP2_PROTO_VER_V2_DRAFT) {
    salt = v2_draft_salt;
  } else {
    return -1;  // the engine offers and accepts no other version
  }
  const size_t saltlen = 20;
  int server = ngtcp2_conn_is_server(conn);
  uint8_t initial[INITIAL_SECRET_LENGTH], client[INITIAL_SECRET_LENGTH], server_secret[INITIAL_SECRET_LENGTH];
  uint8_t rx_key[INITIAL_KEY_LENGTH], rx_iv[MAX_IV_LENGTH], rx_hp[INITIAL_KEY_LENGTH];
  uint8_t tx_key[INITIAL_KEY_LENGTH], tx_iv[MAX_IV_LENGTH], tx_hp[INITIAL_KEY_LENGTH];
  ngtcp2_crypto_aead_ctx rx_aead = {0}, tx_aead = {0}, retry_aead = {0};
  ngtcp2_crypto_cipher_ctx rx_hp_ctx = {0}, tx_hp_ctx = {0};
  int rv = -1;

  if (!vneg) ngtcp2_conn_set_initial_crypto_ctx(conn, &ctx);
  if (ngtcp2_crypto_hkdf_extract(initial, &ctx.md, client_dcid->data, client_dcid->datalen, salt, saltlen) != 0 ||
      ngtcp2_crypto_hkdf_expand_label(client, sizeof(client), &ctx.md, initial, sizeof(initial), client_label,
                                      sizeof(client_label) - 1) != 0 ||
      ngtcp2_crypto_hkdf_expand_label(server_secret, sizeof(server_secret), &ctx.md, initial, sizeof(initial),
                                      server_label, sizeof(server_label) - 1) != 0) {
    goto done;
  }
  const uint8_t *rx_secret = server ? client : server_secret, *tx_secret = server ? server_secret : client;
  if (derive_packet_keys(rx_key, rx_iv, rx_hp, version, &ctx, rx_secret, INITIAL_SECRET_LENGTH) != 0 ||
      derive_packet_keys(tx_key, tx_iv, tx_hp, version, &ctx, tx_secret, INITIAL_SECRET_LENGTH) != 0 ||
      aead_context_init(&rx_aead, &ctx.aead, rx_key) != 0 || header_context_init(&rx_hp_ctx, &ctx.hp, rx_hp) != 0 ||
      aead_context_init(&tx_aead, &ctx.aead, tx_key) != 0 || header_context_init(&tx_hp_ctx, &ctx.hp, tx_hp) != 0) {
    goto done;
  }
  size_t ivlen = ngtcp2_crypto_packet_protection_ivlen(&ctx.aead);
  if (vneg) {
    rv = ngtcp2_conn_install_vneg_initial_key(conn, version, &rx_aead, rx_iv, &rx_hp_ctx, &tx_aead, tx_iv,
                                              &tx_hp_ctx, ivlen);
    goto done;
  }
  // A client checks a Retry's integrity tag with a fixed key (RFC 9001 §5.8), once.
  if (!server && !ngtcp2_conn_after_retry(conn)) {
    const uint8_t *retry_key =
        (const uint8_t *)(version == NGTCP2_PROTO_VER_V1 ? NGTCP2_RETRY_KEY_V1 : NGTCP2_RETRY_KEY_V2_DRAFT);
    if (aead_context_init(&retry_aead, &ctx.aead, retry_key) != 0) goto done;
  }
  rv = ngtcp2_conn_install_initial_key(conn, &rx_aead, rx_iv, &rx_hp_ctx, &tx_aead, tx_iv, &tx_hp_ctx, ivlen);
  if (rv == 0 && retry_aead.native_handle) ngtcp2_conn_set_retry_aead(conn, &ctx.aead, &retry_aead);

done:
  if (rv != 0) {
    aead_context_free(&retry_aead);
    header_context_free(&tx_hp_ctx);
    aead_context_free(&tx_aead);
    header_context_free(&rx_hp_ctx);
    aead_context_free(&rx_aead);
  }
  explicit_bzero(initial, sizeof(initial));
  explicit_bzero(client, sizeof(client));
  explicit_bzero(server_secret, sizeof(server_secret));
  explicit_bzero(rx_key, sizeof(rx_key));
  explicit_bzero(tx_key, sizeof(tx_key));
  explicit_bzero(rx_hp, sizeof(rx_hp));
  explicit_bzero(tx_hp, sizeof(tx_hp));
  return rv == 0 ? 0 : -1;
}

// ---- ngtcp2 callbacks -----------------------------------------------------------------

static int client_initial(ngtcp2_conn *conn, void *user_data) {
  (void)user_data;
  if (install_initial_keys(conn, ngtcp2_conn_get_client_chosen_version(conn), ngtcp2_conn_get_dcid(conn), 0) != 0 ||
      ngtcp2_crypto_read_write_crypto_data(conn, NGTCP2_CRYPTO_LEVEL_INITIAL, NULL, 0) != 0) {
    return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  return 0;
}

static int recv_client_initial(ngtcp2_conn *conn, const ngtcp2_cid *dcid, void *user_data) {
  (void)user_data;
  return install_initial_keys(conn, ngtcp2_conn_get_client_chosen_version(conn), dcid, 0) == 0
             ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
}

static int recv_retry(ngtcp2_conn *conn, const ngtcp2_pkt_hd *hd, void *user_data) {
  (void)user_data;
  return install_initial_keys(conn, ngtcp2_conn_get_client_chosen_version(conn), &hd->scid, 0) == 0
             ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
}

static int version_negotiation(ngtcp2_conn *conn, uint32_t version, const ngtcp2_cid *client_dcid, void *user_data) {
  (void)user_data;
  return install_initial_keys(conn, version, client_dcid, 1) == 0 ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
}

// 1-RTT key update (RFC 9001 §6): next secrets by "quic ku", same header-protection keys.
static int update_key(ngtcp2_conn *conn, uint8_t *rx_secret, uint8_t *tx_secret, ngtcp2_crypto_aead_ctx *rx_aead_ctx,
                      uint8_t *rx_iv, ngtcp2_crypto_aead_ctx *tx_aead_ctx, uint8_t *tx_iv,
                      const uint8_t *current_rx_secret, const uint8_t *current_tx_secret, size_t secretlen,
                      void *user_data) {
  static const uint8_t label[] = "quic ku";
  (void)user_data;
  const ngtcp2_crypto_ctx *ctx = ngtcp2_conn_get_crypto_ctx(conn);
  uint32_t version = ngtcp2_conn_get_negotiated_version(conn);
  uint8_t rx_key[MAX_KEY_LENGTH], tx_key[MAX_KEY_LENGTH];
  int rv = -1;
  if (ngtcp2_crypto_hkdf_expand_label(rx_secret, secretlen, &ctx->md, current_rx_secret, secretlen, label,
                                      sizeof(label) - 1) == 0 &&
      ngtcp2_crypto_hkdf_expand_label(tx_secret, secretlen, &ctx->md, current_tx_secret, secretlen, label,
                                      sizeof(label) - 1) == 0 &&
      derive_packet_keys(rx_key, rx_iv, NULL, version, ctx, rx_secret, secretlen) == 0 &&
      derive_packet_keys(tx_key, tx_iv, NULL, version, ctx, tx_secret, secretlen) == 0 &&
      aead_context_init(rx_aead_ctx, &ctx->aead, rx_key) == 0) {
    rv = aead_context_init(tx_aead_ctx, &ctx->aead, tx_key);
    if (rv != 0) aead_context_free(rx_aead_ctx);
  }
  explicit_bzero(rx_key, sizeof(rx_key));
  explicit_bzero(tx_key, sizeof(tx_key));
  return rv == 0 ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
}

static void delete_aead_context(ngtcp2_conn *conn, ngtcp2_crypto_aead_ctx *aead_ctx, void *user_data) {
  (void)conn;
  (void)user_data;
  aead_context_free(aead_ctx);
}

static void delete_cipher_context(ngtcp2_conn *conn, ngtcp2_crypto_cipher_ctx *cipher_ctx, void *user_data) {
  (void)conn;
  (void)user_data;
  header_context_free(cipher_ctx);
}

static void set_callbacks(ngtcp2_callbacks *cb, int is_server) {
  if (is_server) {
    cb->recv_client_initial = recv_client_initial;
  } else {
    cb->client_initial = client_initial;
    cb->recv_retry = recv_retry;
  }
  cb->encrypt = encrypt_packet;
  cb->decrypt = decrypt_packet;
  cb->hp_mask = header_mask;
  cb->update_key = update_key;
  cb->delete_crypto_aead_ctx = delete_aead_context;
  cb->delete_crypto_cipher_ctx = delete_cipher_context;
  cb->version_negotiation = version_negotiation;
}

static int configure_session(gnutls_session_t session) {
  gnutls_handshake_set_secret_function(session, secret_func);
  return 0;
}

static const cngtcp2_packet_protection boringssl_backend = {
    .set_callbacks = set_callbacks,
    .configure_session = configure_session,
};

const cngtcp2_packet_protection *cquic_packet_protection_boringssl(void) { return &boringssl_backend; }
