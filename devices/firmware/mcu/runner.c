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

#define PAINT 0xA5A5A5A5u
#define PAINT_BYTES 4096u

/* ---- semihosting ---- */

static int semihost(int op, const void *arg)
{
	register int r0 __asm__("r0") = op;
	register const void *r1 __asm__("r1") = arg;
	__asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
	return r0;
}

void _exit(int code);
void _exit(int code)
{
	static const char fault[] = "FAIL fault\n";
	uint32_t b[2] = { 0x20026u /* ADP_Stopped_ApplicationExit */, (uint32_t)code };

	if (code == 127) { /* mcu/startup.c's fault */
		semihost(0x04, fault);
	}
	semihost(0x20, b); /* SYS_EXIT_EXTENDED */
	for (;;) {
	}
}

/* newlib's stdout ends here: SYS_WRITE0 of NUL-terminated pieces. */
int _write(int fd, const char *p, int n);
int _write(int fd, const char *p, int n)
{
	char b[65];
	int done = 0;

	(void)fd;
	while (done < n) {
		int k = n - done < 64 ? n - done : 64;

		memcpy(b, p + done, (size_t)k);
		b[k] = 0;
		semihost(0x04, b); /* SYS_WRITE0 */
		done += k;
	}
	return n;
}

extern char end;
static char *brk;

/* newlib's malloc grows the heap through _sbrk, from the end of .bss
 * towards the stack at the top of RAM. */
void *_sbrk(int incr);
void *_sbrk(int incr)
{
	char *p;

	if (brk == NULL) {
		brk = &end;
	}
	p = brk;
	brk += incr;
	return p;
}

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
static int overflow;

static inline __attribute__((always_inline)) uint32_t *sp_now(void)
{
	uint32_t *sp;

	__asm__ volatile("mov %0, sp" : "=r"(sp));
	return sp;
}

/* paint fills the PAINT_BYTES below base, the probe's stack pointer:
 * inlined, so that no frame of its own is below base while it paints. */
static inline __attribute__((always_inline)) void paint(uint32_t *base)
{
	volatile uint32_t *w = base; /* volatile: not made into a memset call, whose frame would be below base */

	for (uint32_t i = 1; i <= PAINT_BYTES / 4; i++) {
		w[-(int32_t)i] = PAINT;
	}
}

static inline __attribute__((always_inline)) void scan(uint32_t *base, int probe)
{
	volatile uint32_t *w = base - PAINT_BYTES / 4;
	uint32_t used;

	if (*w != PAINT) {
		overflow = 1;
	}
	while (w < base && *w == PAINT) {
		w++;
	}
	used = (uint32_t)((uintptr_t)base - (uintptr_t)w);
	if (used > peak[probe]) {
		peak[probe] = used;
	}
	calls[probe]++;
}

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
		scan(base, P_OPEN);
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
		scan(base, signed_probe ? P_SIGNED : r->apply ? P_PROCESS_APPLY : P_PROCESS_NOAPPLY);
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
		scan(base, P_ENCODE_ACK);
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
