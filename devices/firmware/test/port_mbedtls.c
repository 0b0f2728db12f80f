/*
 * The host port's crypto on Debian's mbedTLS (libmbedtls-dev, 2.28): SHA-256
 * and ES256 verify against the vectors' keys (efs_vkeys). Included by
 * host.c; what a device's port does with its own key store.
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

static int es256_verify(const efs_vblob *point, const uint8_t digest[32], const uint8_t sig[64])
{
	size_t pn;
	uint8_t *pt = blob(point, &pn);
	int ret = es256_verify_point(pt, pn, digest, sig);

	free(pt);
	return ret;
}

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
		return es256_verify(&k->point, digest, sig) == 0 ? EFS_PORT_OK : EFS_PORT_BAD_SIGNATURE;
	}
	return EFS_PORT_UNKNOWN_KEY;
}
