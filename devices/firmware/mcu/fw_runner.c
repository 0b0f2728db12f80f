/*
 * The firmware job's runner on an emulated Cortex-M3/M4 (QEMU mps2-an385
 * and mps2-an386, semihosting): test/fw_host.c, included below with its
 * main renamed, runs the Go scenarios, the job's refusals and boots, and
 * the power cuts (every EFS_FW_TEAR_STRIDE-th byte: the host runs every
 * byte) on the target. The link wraps efs_fw_handle, efs_fw_process,
 * efs_fw_open and efs_fw_boot (-Wl,--wrap=...) with mcu/board.h's stack
 * probe: their peak stack, the port's frames (the flash simulator's, and
 * with EFS_FW_CRYPTO mbedTLS's verify) included; a probed call inside
 * another (efs_fw_process in efs_fw_handle) counts in the outer one only.
 *
 * With EFS_FW_CRYPTO (mbedTLS's source built for the target, as
 * mcu/runner.c's) the root's signatures over the manifests and the resets
 * are verified on the target (ES256, test/fw_vectors.c's root_verify), its
 * heap a static buffer; without it the port looks up what Go verified.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "efshim_fw.h"

#define main efs_fw_runner_main
#include "../test/fw_host.c"
#undef main

#include "board.h"

#ifdef EFS_FW_CRYPTO
#include "mbedtls/memory_buffer_alloc.h"

static unsigned char crypto_heap[6400] __attribute__((aligned(8))); /* mcu/runner.c's */
#endif

enum { P_HANDLE, P_PROCESS, P_OPEN, P_BOOT, P_N };
static const char *const probe_name[P_N] = {
	"efs_fw_handle (the Go scenarios: a reset, or a step with its manifest's check)",
	"efs_fw_process (a firmware step: decode, check, admit, slot bytes, job record, mark)",
	"efs_fw_open (both job records read, the mark rolled forward)",
	"efs_fw_boot (settle, verify the trial slot, spend a try)",
};
static uint32_t peak[P_N], calls[P_N];
static unsigned depth;

#define PROBE(p, call)                                   \
	do {                                             \
		uint32_t *base = sp_now();               \
		if (depth++ == 0) {                      \
			paint(base);                     \
		}                                        \
		call;                                    \
		if (--depth == 0) {                      \
			scan(base, &peak[p], &calls[p]); \
		}                                        \
	} while (0)

void __real_efs_fw_handle(efs_fw *fw, const uint8_t *device, size_t dn, const uint8_t *buf, size_t n, efs_result *r);
void __wrap_efs_fw_handle(efs_fw *fw, const uint8_t *device, size_t dn, const uint8_t *buf, size_t n, efs_result *r);
void __wrap_efs_fw_handle(efs_fw *fw, const uint8_t *device, size_t dn, const uint8_t *buf, size_t n, efs_result *r)
{
	PROBE(P_HANDLE, __real_efs_fw_handle(fw, device, dn, buf, n, r));
}

void __real_efs_fw_process(efs_fw *fw, const uint8_t *device, size_t dn, const uint8_t *buf, size_t n, efs_result *r);
void __wrap_efs_fw_process(efs_fw *fw, const uint8_t *device, size_t dn, const uint8_t *buf, size_t n, efs_result *r);
void __wrap_efs_fw_process(efs_fw *fw, const uint8_t *device, size_t dn, const uint8_t *buf, size_t n, efs_result *r)
{
	PROBE(P_PROCESS, __real_efs_fw_process(fw, device, dn, buf, n, r));
}

efs_err __real_efs_fw_open(efs_fw *fw, const efs_fw_port *port, efs_ctx *fence);
efs_err __wrap_efs_fw_open(efs_fw *fw, const efs_fw_port *port, efs_ctx *fence);
efs_err __wrap_efs_fw_open(efs_fw *fw, const efs_fw_port *port, efs_ctx *fence)
{
	efs_err e = EFS_OK;

	PROBE(P_OPEN, e = __real_efs_fw_open(fw, port, fence));
	return e;
}

efs_err __real_efs_fw_boot(efs_fw *fw, efs_fw_boot_info *info);
efs_err __wrap_efs_fw_boot(efs_fw *fw, efs_fw_boot_info *info);
efs_err __wrap_efs_fw_boot(efs_fw *fw, efs_fw_boot_info *info)
{
	efs_err e = EFS_OK;

	PROBE(P_BOOT, e = __real_efs_fw_boot(fw, info));
	return e;
}

int main(void);
int main(void)
{
	int rc;

#ifdef EFS_FW_CRYPTO
	mbedtls_memory_buffer_alloc_init(crypto_heap, sizeof crypto_heap);
#endif
	rc = efs_fw_runner_main();

	for (int i = 0; i < P_N; i++) {
		printf("stack peak %lu bytes over %lu calls: %s\n", (unsigned long)peak[i], (unsigned long)calls[i],
			probe_name[i]);
	}
	printf("sizeof efs_fw %u\n", (unsigned)sizeof(efs_fw));
	if (overflow) {
		printf("FAIL stack probe: a call used all %u painted bytes\n", PAINT_BYTES);
		rc = 1;
	}
	fflush(stdout);
	return rc;
}
