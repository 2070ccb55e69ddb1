// Most of this module is static inline in include/CNGTCP2.h; the few helpers
// with a body too long to inline live here.
#include "CNGTCP2.h"

#include <string.h>
#include <time.h>

int cngtcp2_generate_self_signed_p256(const char *common_name, unsigned int days,
                                      gnutls_datum_t *cert_pem,
                                      gnutls_datum_t *key_pem) {
  gnutls_x509_privkey_t key = NULL;
  gnutls_x509_crt_t crt = NULL;
  unsigned char serial[16];
  time_t now = time(NULL);
  int rv;

  cert_pem->data = NULL;
  cert_pem->size = 0;
  key_pem->data = NULL;
  key_pem->size = 0;

  if ((rv = gnutls_x509_privkey_init(&key)) < 0) goto out;
  if ((rv = gnutls_x509_privkey_generate(key, GNUTLS_PK_ECDSA,
                                         cngtcp2_gnutls_p256_bits(), 0)) < 0) goto out;
  if ((rv = gnutls_x509_crt_init(&crt)) < 0) goto out;
  if ((rv = gnutls_x509_crt_set_version(crt, 3)) < 0) goto out;
  if ((rv = gnutls_rnd(GNUTLS_RND_NONCE, serial, sizeof(serial))) < 0) goto out;
  serial[0] &= 0x7f; /* positive INTEGER */
  if ((rv = gnutls_x509_crt_set_serial(crt, serial, sizeof(serial))) < 0) goto out;
  if ((rv = gnutls_x509_crt_set_activation_time(crt, now - 3600)) < 0) goto out;
  if ((rv = gnutls_x509_crt_set_expiration_time(crt, now + (time_t)days * 86400)) < 0) goto out;
  if ((rv = gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0,
                                          common_name, (unsigned)strlen(common_name))) < 0) goto out;
  if ((rv = gnutls_x509_crt_set_key(crt, key)) < 0) goto out;
  if ((rv = gnutls_x509_crt_set_key_usage(crt, GNUTLS_KEY_DIGITAL_SIGNATURE)) < 0) goto out;
  if ((rv = gnutls_x509_crt_sign2(crt, crt, key, GNUTLS_DIG_SHA256, 0)) < 0) goto out;
  if ((rv = gnutls_x509_crt_export2(crt, GNUTLS_X509_FMT_PEM, cert_pem)) < 0) goto out;
  if ((rv = gnutls_x509_privkey_export2_pkcs8(key, GNUTLS_X509_FMT_PEM, NULL,
                                              GNUTLS_PKCS_PLAIN, key_pem)) < 0) goto out;
  rv = 0;

out:
  if (rv < 0) {
    gnutls_free(cert_pem->data);
    gnutls_free(key_pem->data);
    cert_pem->size = 0;
    key_pem->size = 0;
  }
  if (crt) gnutls_x509_crt_deinit(crt);
  if (key) gnutls_x509_privkey_deinit(key);
  return rv;
}
