/*
 * ES256 verify on Debian's mbedTLS (libmbedtls-dev, 2.28): sig (r || s)
 * over digest with the P-256 point pt (uncompressed, pn bytes); 0 if it
 * verifies. Included by the host ports (port_mbedtls.c, fw_vectors.c).
 */
#include "mbedtls/ecdsa.h"

static int es256_verify_point(const uint8_t *pt, size_t pn, const uint8_t digest[32], const uint8_t sig[64])
{
	mbedtls_ecp_group grp;
	mbedtls_ecp_point q;
	mbedtls_mpi r, s;
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
	return ret;
}
