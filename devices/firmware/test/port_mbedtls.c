/*
 * The port's crypto on mbedTLS 2.28: SHA-256 over the library's slices and
 * ES256 verify of r || s against a SEC1 public key, then the key store of
 * the vectors' keys (efs_vkeys). Included by host.c: on the host against
 * Debian's libmbedcrypto (libmbedtls-dev), on Cortex-M (mcu/runner.c)
 * against mbedTLS built for the target (mcu/mbedtls_config.h); what a
 * device's port does with its own key store. mcu/size.c includes the crypto
 * alone (EFS_PORT_CRYPTO_ONLY) for its size.
 */
#include "mbedtls/sha256.h"

#include "es256_mbedtls.c"

static int port_sha256(void *user, const struct efs_bytes *parts, size_t n, uint8_t digest[32])
{
	mbedtls_sha256_context h;
	int ret;

	(void)user;
	mbedtls_sha256_init(&h);
	ret = mbedtls_sha256_starts_ret(&h, 0);
	for (size_t i = 0; ret == 0 && i < n; i++) {
		ret = mbedtls_sha256_update_ret(&h, parts[i].p, parts[i].n);
	}
	if (ret == 0) {
		ret = mbedtls_sha256_finish_ret(&h, digest);
	}
	mbedtls_sha256_free(&h);
	return ret;
}

static int es256_verify(const uint8_t *pt, size_t pn, const uint8_t digest[32], const uint8_t sig[64])
{
	return es256_verify_point(pt, pn, digest, sig);
}

#ifndef EFS_PORT_CRYPTO_ONLY
static int port_verify(void *user, const uint8_t *kid, size_t kid_len, const uint8_t *device, size_t device_len,
	const uint8_t digest[32], const uint8_t sig[64])
{
	(void)user;
	for (size_t i = 0; i < EFS_VKEYS_N; i++) {
		const efs_vkey *k = &efs_vkeys[i];
		if (strlen(k->kid) != kid_len || memcmp(k->kid, kid, kid_len) != 0) {
			continue;
		}
		if (k->device != NULL && (strlen(k->device) != device_len || memcmp(k->device, device, device_len) != 0)) {
			return EFS_PORT_NOT_AUTHORISED;
		}
		size_t pn;
		uint8_t *pt = blob(&k->point, &pn);
		int ret = es256_verify(pt, pn, digest, sig);

		free(pt);
		return ret == 0 ? EFS_PORT_OK : EFS_PORT_BAD_SIGNATURE;
	}
	return EFS_PORT_UNKNOWN_KEY;
}

/* port_verify_root checks a reset's signature with the vectors' operator
 * root (efs_vroots). */
static int port_verify_root(void *user, const uint8_t *kid, size_t kid_len, const uint8_t digest[32],
	const uint8_t sig[64])
{
	const efs_vroot *k = &efs_vroots[0];
	size_t pn;
	uint8_t *pt;
	int ret;

	(void)user;
	if (strlen(k->kid) != kid_len || memcmp(k->kid, kid, kid_len) != 0) {
		return EFS_PORT_UNKNOWN_KEY;
	}
	pt = blob(&k->point, &pn);
	ret = es256_verify(pt, pn, digest, sig);
	free(pt);
	return ret == 0 ? EFS_PORT_OK : EFS_PORT_BAD_SIGNATURE;
}
#endif
