/*
 * The host port's crypto on Debian's mbedTLS (libmbedtls-dev, 2.28): SHA-256
 * and ES256 verify against the vectors' keys (efs_vkeys). Included by
 * host.c; what a device's port does with its own key store.
 */
#include "mbedtls/ecdsa.h"
#include "mbedtls/sha256.h"

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
	mbedtls_ecp_group grp;
	mbedtls_ecp_point q;
	mbedtls_mpi r, s;
	size_t pn;
	uint8_t *pt = blob(point, &pn);
	int ret;

	mbedtls_ecp_group_init(&grp);
	mbedtls_ecp_point_init(&q);
	mbedtls_mpi_init(&r);
	mbedtls_mpi_init(&s);
	ret = mbedtls_ecp_group_load(&grp, MBEDTLS_ECP_DP_SECP256R1);
	if (ret == 0) {
		ret = mbedtls_ecp_point_read_binary(&grp, &q, pt, pn);
	}
	if (ret == 0) {
		ret = mbedtls_mpi_read_binary(&r, sig, 32);
	}
	if (ret == 0) {
		ret = mbedtls_mpi_read_binary(&s, sig + 32, 32);
	}
	if (ret == 0) {
		ret = mbedtls_ecdsa_verify(&grp, digest, 32, &q, &r, &s);
	}
	mbedtls_mpi_free(&s);
	mbedtls_mpi_free(&r);
	mbedtls_ecp_point_free(&q);
	mbedtls_ecp_group_free(&grp);
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

/* port_verify_root checks a reset's signature with the vectors' operator
 * root (efs_vroots). */
static int port_verify_root(void *user, const uint8_t *kid, size_t kid_len, const uint8_t digest[32],
	const uint8_t sig[64])
{
	const efs_vroot *k = &efs_vroots[0];

	(void)user;
	if (strlen(k->kid) != kid_len || memcmp(k->kid, kid, kid_len) != 0) {
		return EFS_PORT_UNKNOWN_KEY;
	}
	return es256_verify(&k->point, digest, sig) == 0 ? EFS_PORT_OK : EFS_PORT_BAD_SIGNATURE;
}
