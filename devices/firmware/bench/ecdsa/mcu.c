/* Cortex-M3/M4 run of verify.c on QEMU's mps2-an385/an386 under -icount shift=0
 * (one instruction, one virtual nanosecond): SysTick, clocked at the
 * board's 25 MHz, counts instructions in steps of 40. Output and exit by
 * semihosting (startup: ../../mcu/startup.c). */
#include <stdint.h>
#include <string.h>

int verify_once(int flip);
static uint32_t heap_used(void);

#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)

static int semihost(int op, const void *arg)
{
	register int r0 __asm__("r0") = op;
	register const void *r1 __asm__("r1") = arg;
	__asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
	return r0;
}

static void put(const char *s) { semihost(0x04, s); } /* SYS_WRITE0 */

static void putu(uint32_t v)
{
	char b[12];
	int i = sizeof b - 1;
	b[i] = 0;
	do {
		b[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	put(b + i);
}

void _exit(int code);
void _exit(int code)
{
	uint32_t b[2] = {0x20026u /* ApplicationExit */, (uint32_t)code};
	if (code == 127) /* ../../mcu/startup.c's fault */
		put("fault\n");
	semihost(0x20, b); /* SYS_EXIT_EXTENDED */
	for (;;)
		;
}

/* ticks elapsed on the down-counting 24-bit SysTick between a and b. */
static uint32_t ticks(uint32_t a, uint32_t b) { return (a - b) & 0xFFFFFFu; }

static void calibrate(void)
{
	uint32_t a, b, n = 1000000;
	a = SYST_CVR;
	__asm__ volatile("1: subs %0, %0, #1\n\tbne 1b" : "+r"(n) : : "cc");
	b = SYST_CVR;
	put("calibration: 2,000,000 instructions counted as ");
	putu(ticks(a, b) * 40u);
	put("\n");
}

int main(void)
{
	uint32_t a, b, best = 0xFFFFFFFFu;
	int i;

	SYST_RVR = 0xFFFFFFu;
	SYST_CVR = 0;
	SYST_CSR = 5u; /* enable, processor clock, no interrupt */
	calibrate();
	if (verify_once(1) == 0) {
		put("forged vector accepted\n");
		_exit(1);
	}
	for (i = 0; i < 3; i++) {
		a = SYST_CVR;
		if (verify_once(0) != 0) {
			put("valid vector refused\n");
			_exit(1);
		}
		b = SYST_CVR;
		if (ticks(a, b) * 40u < best)
			best = ticks(a, b) * 40u;
	}
#if defined(__ARM_ARCH_7EM__)
	put("cortex-m4 mbedTLS ES256 verify: ");
#else
	put("cortex-m3 mbedTLS ES256 verify: ");
#endif
	putu(best);
	put(" instructions; heap high-water ");
	putu(heap_used());
	put(" bytes\n");
	_exit(0);
	return 0;
}

/* Startup: ../../mcu/startup.c; a heap for mbedTLS. */
extern uint32_t end;

static char *brk;

/* newlib's malloc grows the heap through _sbrk and never shrinks it: the
 * break is the heap's high-water mark. */
void *_sbrk(int incr)
{
	char *p;
	if (!brk)
		brk = (char *)&end;
	p = brk;
	brk += incr;
	return p;
}

static uint32_t heap_used(void) { return brk ? (uint32_t)(brk - (char *)&end) : 0u; }
