/*
 * The emulated board's runtime for the Cortex-M runners (mcu/runner.c,
 * mcu/fw_runner.c; each includes it once): semihosting for newlib's
 * output and exit, the heap, and the stack probe (paint the PAINT_BYTES
 * below a call's stack pointer, call, find the lowest word written).
 */
#ifndef EFS_MCU_BOARD_H
#define EFS_MCU_BOARD_H

#include <stdint.h>
#include <string.h>

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

static int overflow; /* a call used every painted byte */

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

static inline __attribute__((always_inline)) void scan(uint32_t *base, uint32_t *peak, uint32_t *calls)
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
	if (used > *peak) {
		*peak = used;
	}
	(*calls)++;
}

#endif
