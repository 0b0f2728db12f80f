/*
 * Host figures for docs/BENCHMARKS.md: the operator's reset in the C
 * library (efs_handle) on the simulated flash with the host port's mbedTLS
 * verify: decoding a reset statement, a replayed reset (verified, then
 * refused: no write) and an accepted one (verified, mark and counter
 * written and read back). Build and run:
 *
 *	cc -std=c99 -O2 -Iinclude -o /tmp/efs-reset-bench test/reset_bench.c src/efs_*.c -lmbedcrypto && /tmp/efs-reset-bench
 */
#define _POSIX_C_SOURCE 199309L
#include <time.h>

#define main efs_host_main
#include "host.c"
#undef main

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(void)
{
	const efs_vreset *v = reset_vector("next counter");
	const long decodes = 1000000, verifies = 300;
	size_t n;
	uint8_t *in = blob(&v->in, &n);
	efs_signed s;
	efs_reset rs;
	rig d;
	double t0, t;

	t0 = now();
	for (long i = 0; i < decodes; i++) {
		if (efs_decode_reset(in, n, &s, &rs) != EFS_OK) {
			return 1;
		}
	}
	printf("%zu-byte reset statement: %.0f ns per decode (efs_decode_reset)\n", n, (now() - t0) / (double)decodes);
	reset_rig(&d, v);
	efs_handle(&d.c, (const uint8_t *)"dev-r", 5, in, n, &d.r);
	t0 = now();
	for (long i = 0; i < verifies; i++) {
		efs_handle(&d.c, (const uint8_t *)"dev-r", 5, in, n, &d.r);
		if (d.r.err != EFS_E_RESET_REPLAY) {
			return 1;
		}
	}
	printf("replayed reset (verified, refused): %.2f ms\n", (now() - t0) / (double)verifies / 1e6);
	t = 0;
	for (long i = 0; i < verifies; i++) {
		reset_rig(&d, v);
		t0 = now();
		efs_handle(&d.c, (const uint8_t *)"dev-r", 5, in, n, &d.r);
		t += now() - t0;
		if (d.r.verdict != EFS_ACCEPTED) {
			return 1;
		}
	}
	printf("accepted reset (verified, written to the simulated flash): %.2f ms\n", t / (double)verifies / 1e6);
	free(in);
	return failures != 0;
}
