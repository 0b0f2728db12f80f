/*
 * Host figures for docs/BENCHMARKS.md: ns per decode+admit+ack of the
 * vectors' "full" and "base" envelopes (no flash). Build and run:
 *
 *	cc -std=c99 -O2 -Iinclude -o /tmp/efs-bench test/bench.c src/efs_*.c && /tmp/efs-bench
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "efshim.h"
#include "../testdata/vectors.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void bench(const char *name)
{
	const efs_vdecode *v = NULL;
	const long n = 2000000;
	efs_mark m = { 3, 1 }, next;
	uint8_t out[EFS_MAX_ACK_SIZE];
	size_t len, sink = 0;
	double t0;

	for (size_t i = 0; i < EFS_VDECODES_N; i++) {
		if (strcmp(efs_vdecodes[i].name, name) == 0) {
			v = &efs_vdecodes[i];
		}
	}
	if (v == NULL || v->in.fill_n != 0) {
		printf("%s: no such vector\n", name);
		return;
	}
	t0 = now();
	for (long i = 0; i < n; i++) {
		efs_envelope env;
		efs_ack a;
		if (efs_decode_envelope(v->in.pre, v->in.pre_n, &env) != EFS_OK) {
			printf("%s: refused\n", name);
			return;
		}
		memset(&a, 0, sizeof a);
		a.device = env.device;
		a.id = env.id;
		a.token = env.token;
		a.seq = env.seq;
		a.verdict = efs_admit(m, env.token, env.seq, &next);
		a.mark = next;
		if (efs_encode_ack(&a, out, sizeof out, &len) == EFS_OK) {
			sink += len;
		}
	}
	printf("%-5s %3zu-byte envelope: %.0f ns per decode+admit+ack (%zu)\n", name, v->in.pre_n, (now() - t0) / (double)n,
		sink / (size_t)n);
}

int main(void)
{
	bench("base");
	bench("full");
	return 0;
}
