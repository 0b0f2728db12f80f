/* The smallest mbedTLS 2.28 configuration that verifies ES256: what a
 * fence point on a microcontroller links for signed commands. */
#ifndef EDGEFENCE_MBEDTLS_CONFIG_H
#define EDGEFENCE_MBEDTLS_CONFIG_H

#define MBEDTLS_HAVE_ASM
#define MBEDTLS_NO_PLATFORM_ENTROPY
#define MBEDTLS_BIGNUM_C
#define MBEDTLS_ECP_C
#define MBEDTLS_ECP_DP_SECP256R1_ENABLED
#define MBEDTLS_ECP_NIST_OPTIM
#define MBEDTLS_ECP_NO_INTERNAL_RNG /* verification handles public data only */
#define MBEDTLS_ECDSA_C
#define MBEDTLS_ASN1_PARSE_C
#define MBEDTLS_ASN1_WRITE_C
#define MBEDTLS_SHA256_C
#define MBEDTLS_SHA256_SMALLER

#include "mbedtls/check_config.h"

#endif
