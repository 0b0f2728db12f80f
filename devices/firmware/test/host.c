/*
 * The host test runner: every conformance vector from the Go fence point
 * (testdata/vectors.h) against the C library, then the flash tests (a
 * simulated NOR flash that cuts the power at every byte of a write and in
 * the middle of an erase). Built and run by firmware_test.go under
 * AddressSanitizer and UBSan; each input is copied to a heap buffer of
 * exactly its size, so a read past it is caught. Prints each failure and
 * exits 1 if there was one. mcu/runner.c builds the same runner for
 * Cortex-M, with this crypto port on mbedTLS built for the target, or
 * without a source for it (EFS_NO_CRYPTO: the signed vectors are counted,
 * not run).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "efshim.h"
#include "../testdata/vectors.h"

#include "check.h"

/* blob returns a heap copy of b of exactly its size (freed by the caller). */
static uint8_t *blob(const efs_vblob *b, size_t *n)
{
	return make_blob(b->pre, b->pre_n, b->fill, b->fill_n, b->post, b->post_n, n);
}

static int blob_equal(const efs_vblob *want, efs_bytes got)
{
	size_t n;
	uint8_t *p = blob(want, &n);
	int eq = n == got.n && (n == 0 || memcmp(p, got.p, n) == 0);

	free(p);
	return eq;
}

static void test_decode(void)
{
	for (size_t i = 0; i < EFS_VDECODES_N; i++) {
		const efs_vdecode *v = &efs_vdecodes[i];
		size_t n;
		uint8_t *in = blob(&v->in, &n);
		efs_envelope env;
		efs_err e = efs_decode_envelope(in, n, &env);

		CHECK((e == EFS_OK) == v->ok, "decode %s: Go %s, C %s", v->name, v->ok ? "accepts" : "refuses",
			efs_strerror(e));
		if (e == EFS_OK && v->ok) {
			CHECK(env.v == v->v && env.token == v->token && env.seq == v->seq && env.issued_at == v->issued_at &&
				env.epoch == v->epoch, "decode %s: numbers differ", v->name);
			CHECK(blob_equal(&v->device, env.device) && blob_equal(&v->id, env.id) &&
				blob_equal(&v->kind, env.kind) && blob_equal(&v->body, env.body) &&
				blob_equal(&v->holder, env.holder), "decode %s: strings differ", v->name);
		}
		free(in);
	}
}

static void test_admit(void)
{
	for (size_t i = 0; i < EFS_VADMITS_N; i++) {
		const efs_vadmit *v = &efs_vadmits[i];
		efs_mark m = { v->mark_token, v->mark_seq }, next;
		efs_verdict got = efs_admit(m, v->token, v->seq, &next);

		CHECK((int)got == v->verdict && next.token == v->next_token && next.seq == v->next_seq,
			"admit %llu/%llu at %llu/%llu", (unsigned long long)v->token, (unsigned long long)v->seq,
			(unsigned long long)v->mark_token, (unsigned long long)v->mark_seq);
	}
	for (size_t i = 0; i < EFS_VADMIT_EPOCHS_N; i++) {
		const efs_vadmit_epoch *v = &efs_vadmit_epochs[i];
		efs_state cur = { v->cur_epoch, { v->cur_token, v->cur_seq } }, next;
		efs_verdict got = efs_admit_epoch(v->e, cur, v->epoch, v->token, v->seq, &next);

		CHECK((int)got == v->verdict && next.epoch == v->next_epoch && next.mark.token == v->next_token &&
			next.mark.seq == v->next_seq, "admit epoch %llu %llu/%llu at %llu (own %llu): %d e%llu, want %d e%llu",
			(unsigned long long)v->epoch, (unsigned long long)v->token, (unsigned long long)v->seq,
			(unsigned long long)v->cur_epoch, (unsigned long long)v->e, got, (unsigned long long)next.epoch,
			v->verdict, (unsigned long long)v->next_epoch);
	}
}

/* ack_reason_blank blanks an Invalid ack's reason, as the generator does
 * (each side words its own), but an unknown epoch's (worded alike). */
static void ack_reason_blank(const efs_result *r, efs_ack *a)
{
	if (r->verdict == EFS_INVALID) {
		CHECK(a->reason.n > 0, "Invalid without a reason");
		if (r->err != EFS_E_UNKNOWN_EPOCH) {
			a->reason.n = 0;
		}
	}
}

#ifndef EFS_NO_CRYPTO
#include "port_mbedtls.c"
#endif

/* A NOR flash of two sectors that can lose power at a chosen byte. */
#define SECTOR 512
typedef struct {
	uint8_t mem[2][SECTOR];
	long program_budget; /* bytes programmed before the power is cut; <0: no cut */
	uint8_t torn_bits;   /* the torn byte gets value | torn_bits (0xff: untouched) */
	long erase_budget;   /* bytes erased before the power is cut; <0: no cut */
	int off;             /* power is off: every call fails */
	long programmed;     /* bytes programmed, in all */
	int violations;      /* programs of a byte not erased */
} flash;

static int f_read(void *u, unsigned s, uint32_t off, uint8_t *b, size_t n)
{
	flash *f = u;

	if (f->off || s > 1 || off + n > SECTOR) {
		return -1;
	}
	memcpy(b, f->mem[s] + off, n);
	return 0;
}

static int f_erase(void *u, unsigned s)
{
	flash *f = u;

	if (f->off || s > 1) {
		return -1;
	}
	for (long i = 0; i < SECTOR; i++) {
		if (f->erase_budget >= 0 && i == f->erase_budget) {
			f->off = 1;
			return -1;
		}
		f->mem[s][i] = 0xff;
	}
	return 0;
}

static int f_program(void *u, unsigned s, uint32_t off, const uint8_t *b, size_t n)
{
	flash *f = u;

	if (f->off || s > 1 || off + n > SECTOR) {
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		if (f->mem[s][off + i] != 0xff) {
			f->violations++;
		}
		if (f->program_budget >= 0 && f->programmed == f->program_budget) {
			f->mem[s][off + i] &= (uint8_t)(b[i] | f->torn_bits);
			f->off = 1;
			return -1;
		}
		f->mem[s][off + i] &= b[i];
		f->programmed++;
	}
	return 0;
}

/* check refuses kind "forbidden", as the generator's Go device does. */
static int check(void *user, const struct efs_envelope *env, const char **reason)
{
	(void)user;
	if (env->kind.n == 9 && memcmp(env->kind.p, "forbidden", 9) == 0) {
		*reason = "kind forbidden";
		return 1;
	}
	return 0;
}

static void flash_init(flash *f, efs_port *p)
{
	memset(f, 0, sizeof *f);
	memset(f->mem, 0xff, sizeof f->mem);
	f->program_budget = -1;
	f->erase_budget = -1;
	f->torn_bits = 0xff;
	memset(p, 0, sizeof *p);
	p->user = f;
	p->sector_size = SECTOR;
	p->flash_read = f_read;
	p->flash_erase = f_erase;
	p->flash_program = f_program;
	p->check = check;
}

/* power_on restores the power and reopens the context. */
static efs_err power_on(flash *f, efs_ctx *c, const efs_port *p)
{
	f->off = 0;
	f->program_budget = -1;
	f->erase_budget = -1;
	return efs_open(c, p);
}

/* The prime command the last vector sent, and the flash it left. */
static struct {
	uint8_t *prime, *dev;
	size_t pn, dn;
	int signed_cmds;
	flash f;
} last_prime;

/* send_prime sends a vector's prime command to its fresh flash and reboots.
 * A prime equal to the last one (bytes, device, signed or not) is not sent
 * again: the flash it left is copied, which is all a reboot reads, so the
 * vector starts from the same state. The signed vectors share two primes:
 * two verifies instead of 165, which on Cortex-M under QEMU (about 25 M
 * instructions a verify) halves the run. */
static void send_prime(const efs_vprocess *v, flash *f, efs_ctx *c, const efs_port *port, const uint8_t *dev,
	size_t dn, const uint8_t *prime, size_t pn)
{
	efs_result r;
	int signed_cmds = port->verify != NULL;

	if (last_prime.prime != NULL && pn == last_prime.pn && dn == last_prime.dn &&
		signed_cmds == last_prime.signed_cmds && memcmp(prime, last_prime.prime, pn) == 0 &&
		memcmp(dev, last_prime.dev, dn) == 0) {
		*f = last_prime.f;
	} else {
		efs_process(c, dev, dn, prime, pn, &r);
		CHECK(r.verdict == EFS_ACCEPTED && r.apply, "process %s: prime %s", v->name, r.reason);
		free(last_prime.prime);
		free(last_prime.dev);
		last_prime.prime = malloc(pn);
		last_prime.dev = malloc(dn ? dn : 1);
		if (last_prime.prime == NULL || last_prime.dev == NULL) {
			abort();
		}
		memcpy(last_prime.prime, prime, pn);
		memcpy(last_prime.dev, dev, dn);
		last_prime.pn = pn;
		last_prime.dn = dn;
		last_prime.signed_cmds = signed_cmds;
		last_prime.f = *f;
	}
	CHECK(power_on(f, c, port) == EFS_OK, "process %s: reopen", v->name);
}

static void run_process(const efs_vprocess *table, size_t count, int signed_cmds)
{
	for (size_t i = 0; i < count; i++) {
		const efs_vprocess *v = &table[i];
		flash f;
		efs_port port;
		efs_ctx c;
		efs_result r;
		efs_ack a;
		uint8_t out[EFS_MAX_ACK_SIZE];
		size_t n, dn, pn, len;
		uint8_t *in = blob(&v->in, &n), *dev = blob(&v->device, &dn), *prime = blob(&v->prime, &pn);
		efs_err e;

		flash_init(&f, &port);
#ifndef EFS_NO_CRYPTO
		if (signed_cmds) {
			port.sha256 = port_sha256;
			port.verify = port_verify;
		}
#else
		(void)signed_cmds;
#endif
		CHECK(efs_open(&c, &port) == EFS_OK, "process %s: open", v->name);
		if (pn > 0) {
			send_prime(v, &f, &c, &port, dev, dn, prime, pn);
		}
		efs_process(&c, dev, dn, in, n, &r);
		CHECK((int)r.verdict == v->verdict && r.mark.token == v->mark_token && r.mark.seq == v->mark_seq,
			"process %s: verdict %d mark %llu/%llu (%s), want %d", v->name, r.verdict,
			(unsigned long long)r.mark.token, (unsigned long long)r.mark.seq, r.reason, v->verdict);
		CHECK(r.apply == (r.verdict == EFS_ACCEPTED), "process %s: apply %d", v->name, r.apply);
		efs_result_ack(&r, &a);
		ack_reason_blank(&r, &a); /* Go's and C's texts differ; the rest must not */
		e = efs_encode_ack(&a, out, sizeof out, &len);
		CHECK(e == EFS_OK && blob_equal(&v->ack, (efs_bytes){ out, len }), "process %s: ack differs (%s)",
			v->name, efs_strerror(e));
		if (r.apply) { /* durable: a reboot keeps it */
			CHECK(power_on(&f, &c, &port) == EFS_OK && c.mark.token == v->mark_token &&
				c.mark.seq == v->mark_seq, "process %s: mark lost on reboot", v->name);
		}
		CHECK(f.violations == 0, "process %s: a byte programmed twice", v->name);
		free(in);
		free(dev);
		free(prime);
	}
}

static void test_process(void)
{
	run_process(efs_vprocesses, EFS_VPROCESSES_N, 0);
#ifdef EFS_NO_CRYPTO
	/* A build without a crypto port (mcu/ without mbedTLS's source). */
	printf("signed vectors: %d not run (no crypto port in this build)\n", (int)EFS_VSIGNED_N);
#else
	run_process(efs_vsigned, EFS_VSIGNED_N, 1);
#endif
}

static void test_acks_and_marks(void)
{
	for (size_t i = 0; i < EFS_VACKS_N; i++) {
		const efs_vack *v = &efs_vacks[i];
		uint8_t out[EFS_MAX_ACK_SIZE];
		size_t dn, idn, rn, len;
		uint8_t *dev = blob(&v->device, &dn), *id = blob(&v->id, &idn), *reason = blob(&v->reason, &rn);
		efs_ack a = { { dev, dn }, { id, idn }, (efs_verdict)v->verdict, v->token, v->seq,
			{ v->mark_token, v->mark_seq }, { reason, rn }, v->epoch };
		efs_err e = efs_encode_ack(&a, out, sizeof out, &len);

		CHECK(e == EFS_OK && blob_equal(&v->out, (efs_bytes){ out, len }), "ack %zu differs (%s)", i,
			efs_strerror(e));
		e = efs_encode_ack(&a, out, len - 1, &len);
		CHECK(e == EFS_E_BUFFER, "ack %zu: short buffer: %s", i, efs_strerror(e));
		free(dev);
		free(id);
		free(reason);
	}
	for (size_t i = 0; i < EFS_VMARKS_N; i++) {
		const efs_vmark *v = &efs_vmarks[i];
		efs_mark_record r, back;
		uint8_t out[EFS_MARK_RECORD_MAX];
		size_t hn, idn, len, wn;
		uint8_t *h = blob(&v->holder, &hn), *id = blob(&v->id, &idn), *want = blob(&v->out, &wn);

		memset(&r, 0, sizeof r);
		r.epoch = v->epoch;
		r.mark.token = v->token;
		r.mark.seq = v->seq;
		r.holder_len = (uint8_t)hn;
		memcpy(r.holder, h, hn);
		r.id_len = (uint8_t)idn;
		memcpy(r.id, id, idn);
		CHECK(efs_mark_record_encode(&r, out, sizeof out, &len) == EFS_OK && len == wn &&
			memcmp(out, want, wn) == 0, "mark record %zu differs from Go's", i);
		CHECK(efs_mark_record_decode(want, wn, &back) == EFS_OK && back.epoch == v->epoch && back.mark.token == v->token &&
			back.mark.seq == v->seq && back.holder_len == hn && back.id_len == idn,
			"mark record %zu: Go's not read back", i);
		for (size_t bit = 0; bit < wn * 8; bit++) {
			want[bit / 8] ^= (uint8_t)(1u << (bit % 8));
			CHECK(efs_mark_record_decode(want, wn, &back) != EFS_OK, "mark record %zu: bit %zu flipped, accepted",
				i, bit);
			want[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		}
		free(h);
		free(id);
		free(want);
	}
}

#include "flash_tests.c"
#include "reset_tests.c"
#include "epoch_tests.c"

/* Reasons carry 64-bit numbers in decimal (written without 64-bit
 * division): checked against printf at the edges of each 16-bit digit. */
static void test_reason_numbers(void)
{
	static const uint64_t marks[] = { 9, 10, 65535, 65536, 4294967295u, 4294967296u, 10000000000000000000u,
		18446744073709551615u };

	for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
		rig d;
		char want[EFS_MAX_REASON_LEN];

		rig_start(&d, 0);
		send(&d.c, marks[i], marks[i], &d.r);
		CHECK(d.r.apply, "mark %llu: %s", (unsigned long long)marks[i], d.r.reason);
		send(&d.c, marks[i] - 1, 1, &d.r);
		snprintf(want, sizeof want, "token %llu below the high-water mark %llu/%llu",
			(unsigned long long)(marks[i] - 1), (unsigned long long)marks[i], (unsigned long long)marks[i]);
		CHECK(d.r.verdict == EFS_STALE && strcmp(d.r.reason, want) == 0, "stale reason %s, want %s", d.r.reason,
			want);
	}
}

int main(void)
{
	test_decode();
	test_admit();
	test_process();
	test_acks_and_marks();
	test_flash();
	test_resets();
	test_epochs();
	test_reason_numbers();
	printf("%d checks, %d failures\n", checks, failures);
	return failures ? 1 : 0;
}
