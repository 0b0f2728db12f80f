/*
 * The conformance runner on an emulated Cortex-M3/M4 (QEMU mps2-an385 and
 * mps2-an386, semihosting): test/host.c, included below with its main
 * renamed, runs every vector and the flash tests on the target; the rest of
 * this file is its board: startup, output and exit by semihosting, a heap for
 * the runner's copies, and the stack probes (mcu/startup.c: the vector table
 * and reset).
 *
 * Signed vectors: built with EFS_MCU_MBEDTLS (mbedTLS's source compiled for
 * the target with mcu/mbedtls_config.h), the host's crypto port
 * (test/port_mbedtls.c) verifies them here as on the host, its mbedTLS
 * allocating from a static buffer (crypto_heap) whose high-water the link's
 * wrap of mbedtls_calloc records. Without it (EFS_NO_CRYPTO) they are
 * counted, not run.
 *
 * Stack: the link wraps the library's entry points that the library itself
 * never calls (-Wl,--wrap=efs_open,--wrap=efs_process,--wrap=efs_encode_ack).
 * Each call paints the PAINT_BYTES below the probe's stack pointer, calls
 * the library, then finds the lowest word written: the call's peak stack,
 * measured, including its callees (the port's: the flash simulator's frames
 * for a mark's write, the check callback, the crypto). The depth counter
 * guards against a wrapped call nesting in another (a nested probe would
 * repaint what the outer call had used).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "efshim.h"

#ifdef EFS_MCU_MBEDTLS
#include "mbedtls/memory_buffer_alloc.h"
#else
#define EFS_NO_CRYPTO
#endif
#define main efs_runner_main
#include "../test/host.c"
#undef main

#include "board.h"

#ifdef EFS_MCU_MBEDTLS
/* ---- the crypto's static heap ---- */

#ifndef EFS_MCU_CRYPTO_HEAP
#define EFS_MCU_CRYPTO_HEAP 6400 /* measured: 6,164 B at most over the signed and reset vectors (6,144 B failed two resets) */
#endif
static unsigned char crypto_heap[EFS_MCU_CRYPTO_HEAP] __attribute__((aligned(8)));
static uint32_t heap_high; /* highest byte of crypto_heap an allocation reached */
static uint32_t heap_failed;

void *__real_mbedtls_calloc(size_t n, size_t size);
void *__wrap_mbedtls_calloc(size_t n, size_t size);
void *__wrap_mbedtls_calloc(size_t n, size_t size)
{
	unsigned char *p = __real_mbedtls_calloc(n, size);

	if (p == NULL) {
		heap_failed++;
	} else if ((uint32_t)(p + n * size - crypto_heap) > heap_high) {
		heap_high = (uint32_t)(p + n * size - crypto_heap);
	}
	return p;
}
#endif

/* ---- stack probes ---- */

enum { P_OPEN, P_PROCESS_APPLY, P_PROCESS_NOAPPLY, P_ENCODE_ACK, P_SIGNED_STUB, P_SIGNED, P_N };
static const char *const probe_name[P_N] = {
	"efs_open (boot: read both slots)",
	"efs_process, accepted (decode, check, admit, mark written)",
	"efs_process, not applied (refused, stale, duplicate, storage error)",
	"efs_encode_ack",
	"signed, crypto stubbed: efs_process of the signed vectors, the library's own path",
	"signed, with the port's crypto: efs_process of the signed vectors, mbedTLS verify included",
};
static uint32_t peak[P_N], calls[P_N];
static unsigned depth;
static int signed_probe; /* efs_process calls go to P_SIGNED_STUB */

efs_err __real_efs_open(efs_ctx *c, const efs_port *port);
efs_err __wrap_efs_open(efs_ctx *c, const efs_port *port);
efs_err __wrap_efs_open(efs_ctx *c, const efs_port *port)
{
	uint32_t *base = sp_now();
	efs_err e;

	if (depth++ == 0) {
		paint(base);
	}
	e = __real_efs_open(c, port);
	if (--depth == 0) {
		scan(base, &peak[P_OPEN], &calls[P_OPEN]);
	}
	return e;
}

void __real_efs_process(efs_ctx *c, const uint8_t *device, size_t dn, const uint8_t *buf, size_t n, efs_result *r);
void __wrap_efs_process(efs_ctx *c, const uint8_t *device, size_t dn, const uint8_t *buf, size_t n, efs_result *r);
void __wrap_efs_process(efs_ctx *c, const uint8_t *device, size_t dn, const uint8_t *buf, size_t n, efs_result *r)
{
	uint32_t *base = sp_now();

	if (depth++ == 0) {
		paint(base);
	}
	__real_efs_process(c, device, dn, buf, n, r);
	if (--depth == 0) {
		int p = signed_probe ? P_SIGNED_STUB : c->port->verify != NULL ? P_SIGNED
			: r->apply ? P_PROCESS_APPLY : P_PROCESS_NOAPPLY;

		scan(base, &peak[p], &calls[p]);
	}
}

efs_err __real_efs_encode_ack(const efs_ack *a, uint8_t *out, size_t cap, size_t *n);
efs_err __wrap_efs_encode_ack(const efs_ack *a, uint8_t *out, size_t cap, size_t *n);
efs_err __wrap_efs_encode_ack(const efs_ack *a, uint8_t *out, size_t cap, size_t *n)
{
	uint32_t *base = sp_now();
	efs_err e;

	if (depth++ == 0) {
		paint(base);
	}
	e = __real_efs_encode_ack(a, out, cap, n);
	if (--depth == 0) {
		scan(base, &peak[P_ENCODE_ACK], &calls[P_ENCODE_ACK]);
	}
	return e;
}

/* ---- the signed path's stack ---- */

static int stub_sha256(void *user, const struct efs_bytes *parts, size_t n, uint8_t digest[32])
{
	(void)user;
	(void)parts;
	(void)n;
	memset(digest, 0, 32);
	return 0;
}

static int stub_verify(void *user, const uint8_t *kid, size_t kid_len, const uint8_t *device, size_t device_len,
	const uint8_t digest[32], const uint8_t sig[64])
{
	(void)user;
	(void)kid;
	(void)kid_len;
	(void)device;
	(void)device_len;
	(void)digest;
	(void)sig;
	return EFS_PORT_OK;
}

/* signed_stack runs every signed vector through efs_process with a crypto
 * port that accepts every signature: not conformance (that needs the real
 * crypto, on the host), only the library's own stack on the signed path,
 * its deepest (accepted, mark written) included. */
static void signed_stack(void)
{
	signed_probe = 1;
	for (size_t i = 0; i < EFS_VSIGNED_N; i++) {
		const efs_vprocess *v = &efs_vsigned[i];
		static flash f;
		efs_port port;
		efs_ctx c;
		efs_result r;
		size_t n, dn;
		uint8_t *in = blob(&v->in, &n), *dev = blob(&v->device, &dn);

		flash_init(&f, &port);
		port.sha256 = stub_sha256;
		port.verify = stub_verify;
		__real_efs_open(&c, &port);
		efs_process(&c, dev, dn, in, n, &r);
		free(in);
		free(dev);
	}
	signed_probe = 0;
}

/* ---- instructions (QEMU with -icount shift=0: one instruction a virtual
 * nanosecond; SysTick, clocked at the board's 25 MHz, steps 40 a tick) ---- */

#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)

static uint32_t since(uint32_t a)
{
	return ((a - SYST_CVR) & 0xFFFFFFu) * 40u;
}

/* instructions runs the library's calls unprobed on a fresh simulated
 * flash and prints what each took: a command accepted (its mark written),
 * the same again (a duplicate: decoded, refused with a reason), its ack,
 * and a boot. The flash is RAM here: a real one's erase and program times
 * come on top. */
static void instructions(void)
{
	static rig d;
	uint8_t buf[256], out[EFS_MAX_ACK_SIZE];
	size_t n = envelope_at(buf, "dev", 0, 5, 1, "gateway-b-with-a-long-holder-name"), len;
	efs_ack a;
	uint32_t t[4], at;

	SYST_RVR = 0xFFFFFFu;
	SYST_CVR = 0;
	SYST_CSR = 5u; /* enable, processor clock, no interrupt */
	rig_start(&d, 0);
	at = SYST_CVR;
	__real_efs_process(&d.c, (const uint8_t *)"dev", 3, buf, n, &d.r);
	t[0] = since(at);
	if (!d.r.apply) {
		printf("FAIL instructions: the command was not accepted: %s\n", d.r.reason);
	}
	at = SYST_CVR;
	__real_efs_process(&d.c, (const uint8_t *)"dev", 3, buf, n, &d.r);
	t[1] = since(at);
	if (d.r.verdict != EFS_DUPLICATE) {
		printf("FAIL instructions: the command again was not a duplicate: %s\n", d.r.reason);
	}
	efs_result_ack(&d.r, &a);
	at = SYST_CVR;
	__real_efs_encode_ack(&a, out, sizeof out, &len);
	t[2] = since(at);
	at = SYST_CVR;
	__real_efs_open(&d.c, &d.port);
	t[3] = since(at);
	printf("instructions: accepted %lu, duplicate %lu, ack %lu, boot %lu (a %u-byte command)\n",
		(unsigned long)t[0], (unsigned long)t[1], (unsigned long)t[2], (unsigned long)t[3], (unsigned)n);
}

#ifdef EFS_MCU_MBEDTLS
/* time_signed sends prime (if any) to a fresh flash with the crypto port,
 * reboots, then times in's efs_process. */
static uint32_t time_signed(const efs_vprocess *v, const uint8_t *in, size_t n, efs_result *r)
{
	static flash f;
	efs_port port;
	efs_ctx c;
	size_t dn, pn;
	uint8_t *dev = blob(&v->device, &dn), *prime = blob(&v->prime, &pn);
	uint32_t at, t;

	flash_init(&f, &port);
	port.sha256 = port_sha256;
	port.verify = port_verify;
	__real_efs_open(&c, &port);
	if (pn > 0) {
		__real_efs_process(&c, dev, dn, prime, pn, r);
		__real_efs_open(&c, &port);
	}
	at = SYST_CVR;
	__real_efs_process(&c, dev, dn, in, n, r);
	t = since(at);
	free(dev);
	free(prime);
	return t;
}

/* signed_instructions times the first signed vector that is accepted (after
 * its prime command, as the conformance run sends it): structure,
 * Sig_structure hashed, the ES256 verify (mbedTLS), decode, admit and the
 * mark's write; then a forgery of it (a flipped bit in the signature: the
 * verify runs and refuses). */
static void signed_instructions(void)
{
	for (size_t i = 0; i < EFS_VSIGNED_N; i++) {
		const efs_vprocess *v = &efs_vsigned[i];
		efs_result r;
		size_t n;
		uint8_t *in;
		uint32_t ok, forged;

		if (v->verdict != EFS_ACCEPTED) {
			continue;
		}
		in = blob(&v->in, &n);
		ok = time_signed(v, in, n, &r);
		if (!r.apply) {
			printf("FAIL signed instructions: %s not accepted: %s\n", v->name, r.reason);
		}
		in[n - 1] ^= 1; /* the signature's last byte */
		forged = time_signed(v, in, n, &r);
		if (r.verdict != EFS_INVALID) {
			printf("FAIL signed instructions: %s with a flipped signature bit not refused\n", v->name);
		}
		printf("instructions: signed accepted %lu, signed forged %lu (a %u-byte command, %s)\n",
			(unsigned long)ok, (unsigned long)forged, (unsigned)n, v->name);
		free(in);
		return;
	}
	printf("FAIL signed instructions: no signed vector is accepted\n");
}
#endif

/* ---- board (mcu/startup.c calls main) ---- */

int main(void);
int main(void)
{
	int rc;

#ifdef EFS_MCU_MBEDTLS
	mbedtls_memory_buffer_alloc_init(crypto_heap, sizeof crypto_heap);
#endif
	rc = efs_runner_main();
	signed_stack();

#if defined(__ARM_ARCH_7EM__)
	printf("cpu: cortex-m4\n");
#else
	printf("cpu: cortex-m3\n");
#endif
	for (int i = 0; i < P_N; i++) {
#ifndef EFS_MCU_MBEDTLS
		if (i == P_SIGNED) {
			continue; /* no crypto port in this build */
		}
#endif
		printf("stack peak %lu bytes over %lu calls: %s\n", (unsigned long)peak[i], (unsigned long)calls[i],
			probe_name[i]);
	}
	printf("sizeof efs_ctx %u, efs_result %u\n", (unsigned)sizeof(efs_ctx), (unsigned)sizeof(efs_result));
	instructions();
#ifdef EFS_MCU_MBEDTLS
	signed_instructions();
	printf("crypto heap: high-water %lu of %u bytes (static), %lu allocations failed\n", (unsigned long)heap_high,
		(unsigned)sizeof crypto_heap, (unsigned long)heap_failed);
	if (heap_failed) {
		rc = 1;
	}
#endif
	if (overflow) {
		printf("FAIL stack probe: a call used all %u painted bytes\n", PAINT_BYTES);
		rc = 1;
	}
	fflush(stdout);
	return rc;
}
