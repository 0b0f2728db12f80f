/* mbedTLS 2.28 for the port's ES256 on Cortex-M (mcu/runner.c, mcu/size.c):
 * bench/ecdsa's smallest configuration that verifies ES256, with the heap
 * mbedTLS allocates from made static (a buffer the firmware owns, handed to
 * mbedtls_memory_buffer_alloc_init at boot: no malloc, no sbrk). */
#ifndef EDGEFENCE_MCU_MBEDTLS_CONFIG_H
#define EDGEFENCE_MCU_MBEDTLS_CONFIG_H

#define MBEDTLS_PLATFORM_C
#define MBEDTLS_PLATFORM_MEMORY
#define MBEDTLS_MEMORY_BUFFER_ALLOC_C

#include "../bench/ecdsa/mbedtls_config.h" /* the rest, then mbedTLS's check of the whole */

#endif
