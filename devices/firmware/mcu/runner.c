/*
 * The conformance runner on an emulated Cortex-M3/M4 (QEMU mps2-an385 and
 * mps2-an386, semihosting): test/host.c, included below without its crypto
 * port (EFS_NO_CRYPTO) and its main renamed, runs every unsigned vector and
 * the flash tests on the target; the rest of this file is its board: startup, output and exit by
 * semihosting, a heap for the runner's copies, and the stack probes
 * (mcu/startup.c: the vector table and reset).
 *
 * Stack: the link wraps the library's entry points that the library itself
 * never calls (-Wl,--wrap=efs_open,--wrap=efs_process,--wrap=efs_encode_ack).
 * Each call paints the PAINT_BYTES below the probe's stack pointer, calls
 * the library, then finds the lowest word written: the call's peak stack,
 * measured, including its callees (the port's: the flash simulator's frames
 * for a mark's write, the check callback). The depth counter guards against
 * a wrapped call nesting in another (a nested probe would repaint what the
 * outer call had used).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "efshim.h"

#define EFS_NO_CRYPTO
#define main efs_runner_main
#include "../test/host.c"
#undef main

#include "board.h"

/* ---- stack probes ---- */

enum { P_OPEN, P_PROCESS_APPLY, P_PROCESS_NOAPPLY, P_ENCODE_ACK, P_SIGNED, P_N };
static const char *const probe_name[P_N] = {
	"efs_open (boot: read both slots)",
	"efs_process, accepted (decode, check, admit, mark written)",
	"efs_process, not applied (refused, stale, duplicate, storage error)",
	"efs_encode_ack",
	"signed: efs_process of the signed vectors, the crypto stubbed (add the port's crypto)",
};
static uint32_t peak[P_N], calls[P_N];
static unsigned depth;
static int signed_probe; /* efs_process calls go to P_SIGNED */

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
		int p = signed_probe ? P_SIGNED : r->apply ? P_PROCESS_APPLY : P_PROCESS_NOAPPLY;

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
	size_t n = envelope(buf, 5, 1, "gateway-b-with-a-long-holder-name"), len;
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

/* ---- board (mcu/startup.c calls main) ---- */

int main(void);
int main(void)
{
	int rc = efs_runner_main();

	signed_stack();

#if defined(__ARM_ARCH_7EM__)
	printf("cpu: cortex-m4\n");
#else
	printf("cpu: cortex-m3\n");
#endif
	for (int i = 0; i < P_N; i++) {
		printf("stack peak %lu bytes over %lu calls: %s\n", (unsigned long)peak[i], (unsigned long)calls[i],
			probe_name[i]);
	}
	printf("sizeof efs_ctx %u, efs_result %u\n", (unsigned)sizeof(efs_ctx), (unsigned)sizeof(efs_result));
	instructions();
	if (overflow) {
		printf("FAIL stack probe: a call used all %u painted bytes\n", PAINT_BYTES);
		rc = 1;
	}
	fflush(stdout);
	return rc;
}
