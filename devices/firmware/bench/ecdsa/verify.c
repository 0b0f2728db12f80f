/* One ES256 verification of a signed edgefence command, as a fence point
 * on a microcontroller would do it with mbedTLS: SHA-256 over COSE's
 * Sig_structure, then ECDSA P-256. verify_once returns 0 when the
 * signature holds. Shared by the host and the Cortex-M build. */
#include <string.h>

#include "mbedtls/ecdsa.h"
#include "mbedtls/sha256.h"

#include "vector.h"

int verify_once(int flip)
{
	unsigned char tbs[sizeof vector_tbs];
	unsigned char hash[32];
	mbedtls_ecp_group grp;
	mbedtls_ecp_point q;
	mbedtls_mpi r, s;
	int ret;

	memcpy(tbs, vector_tbs, sizeof tbs);
	if (flip)
		tbs[sizeof tbs - 1] ^= 1; /* a forged payload must fail */
	mbedtls_ecp_group_init(&grp);
	mbedtls_ecp_point_init(&q);
	mbedtls_mpi_init(&r);
	mbedtls_mpi_init(&s);
	ret = mbedtls_sha256_ret(tbs, sizeof tbs, hash, 0);
	if (ret == 0)
		ret = mbedtls_ecp_group_load(&grp, MBEDTLS_ECP_DP_SECP256R1);
	if (ret == 0)
		ret = mbedtls_ecp_point_read_binary(&grp, &q, vector_pub, sizeof vector_pub);
	if (ret == 0)
		ret = mbedtls_mpi_read_binary(&r, vector_sig, 32);
	if (ret == 0)
		ret = mbedtls_mpi_read_binary(&s, vector_sig + 32, 32);
	if (ret == 0)
		ret = mbedtls_ecdsa_verify(&grp, hash, sizeof hash, &q, &r, &s);
	mbedtls_mpi_free(&s);
	mbedtls_mpi_free(&r);
	mbedtls_ecp_point_free(&q);
	mbedtls_ecp_group_free(&grp);
	return ret;
}
