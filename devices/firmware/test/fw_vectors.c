/*
 * The firmware job vectors (included by fw_host.c): every scenario of
 * testdata/fw_vectors.h, run through the Go devices/fwjob, replayed on
 * efs_fw: each command's verdict, mark, refusal class and reason, and the
 * firmware state after each command and each reboot. A refusal of a body
 * Go's CBOR decoder words (fwjob.ErrCommand from fxamacker/cbor) is
 * compared by class only.
 */
#include "../testdata/fw_vectors.h"

static int fw_body_wording; /* ErrCommand reasons worded differently (not failures) */
static int fw_manifest_wording; /* manifests refused malformed: the same up to auth's sentinel, C's own details */

/* The vectors' root: the one root hook (the fence port's verify_root),
 * for the manifests and the resets. */
static int root_kid_ok(const uint8_t *kid, size_t kid_len)
{
	return kid_len == strlen(EFS_FWV_ROOT_KID) && memcmp(kid, EFS_FWV_ROOT_KID, kid_len) == 0;
}

#ifdef EFS_FW_CRYPTO
/* ES256 with the vectors' root (mbedTLS: Debian's on the host, built for
 * the target on Cortex-M). */
#include "es256_mbedtls.c"

static int root_verify(void *user, const uint8_t *kid, size_t kid_len, const uint8_t digest[32], const uint8_t sig[64])
{
	(void)user;
	if (!root_kid_ok(kid, kid_len)) {
		return EFS_PORT_UNKNOWN_KEY;
	}
	return es256_verify_point(EFS_FWV_ROOT_POINT, 65, digest, sig) == 0 ? EFS_PORT_OK : EFS_PORT_BAD_SIGNATURE;
}
#else
/* Without ES256: the digests and signatures Go verified with the root
 * (efs_fwv_root_verified); the library's part (the decoding, the checks,
 * the Sig_structure's hash) runs as with it. */
static int root_verify(void *user, const uint8_t *kid, size_t kid_len, const uint8_t digest[32], const uint8_t sig[64])
{
	(void)user;
	if (!root_kid_ok(kid, kid_len)) {
		return EFS_PORT_UNKNOWN_KEY;
	}
	for (size_t i = 0; i < EFS_FWV_ROOT_VERIFIED_N; i++) {
		if (memcmp(efs_fwv_root_verified[i].d, digest, 32) == 0 && memcmp(efs_fwv_root_verified[i].sig, sig, 64) == 0) {
			return EFS_PORT_OK;
		}
	}
	return EFS_PORT_BAD_SIGNATURE;
}
#endif

static int fw_resets; /* reset steps (efs_fw_handle: the fence point's reset) */

/* app_check is the vectors' application beside the firmware (the Go
 * generator's fwApp): kind app.set, nothing else. */
static int app_check(void *user, const efs_envelope *env, const char **reason)
{
	static char why[EFS_MAX_KIND_LEN + 32];

	(void)user;
	if (env->kind.n == 7 && memcmp(env->kind.p, "app.set", 7) == 0) {
		return 0;
	}
	snprintf(why, sizeof why, "app: unknown kind %.*s", (int)env->kind.n, (const char *)env->kind.p);
	*reason = why;
	return 1;
}

/* auth_detail is the length of Go's reason up to a malformed manifest's
 * sentinel (its details are go-cose's and fxamacker/cbor's words), 0 if
 * the reason has none. */
static size_t auth_detail(const char *reason)
{
	static const char *const s[] = { "auth: malformed signed envelope: ", "auth: algorithm not accepted: " };

	for (size_t i = 0; i < 2; i++) {
		const char *at = strstr(reason, s[i]);
		if (at != NULL) {
			return (size_t)(at - reason) + strlen(s[i]);
		}
	}
	return 0;
}

/* vector_state checks the firmware state after step k. */
static void vector_state(const dev *d, const efs_fwvscenario *sc, size_t k, const efs_fwvstep *v)
{
	const efs_fw_job *j = &d->fw.job;
	const efs_fw_boot_state *b = &d->fw.boot;
	int trial = b->trial != EFS_FW_NO_SLOT && b->running == b->trial;
	size_t rn = strlen(v->job_reason);

	CHECK(j->state == v->state && j->bytes == v->bytes && b->running == v->running && b->active == v->active &&
		b->security == v->security && trial == v->trial && j->seq == v->seq,
		"%s, step %lu: state %s bytes %llu slot %u active %u security %llu trial %d seq %llu; Go: %s %llu %d %d "
		"%llu %d %llu", sc->name, (unsigned long)k, efs_fw_state_name(j->state), (unsigned long long)j->bytes, b->running,
		b->active, (unsigned long long)b->security, trial, (unsigned long long)j->seq, efs_fw_state_name(v->state),
		(unsigned long long)v->bytes, v->running, v->active, (unsigned long long)v->security, v->trial,
		(unsigned long long)v->seq);
	/* The job's reason: Go's, byte for byte (both clip at 200 bytes). */
	CHECK(j->reason_len == rn && memcmp(j->reason, v->job_reason, rn) == 0, "%s, step %lu: job reason \"%.*s\", Go \"%s\"",
		sc->name, (unsigned long)k, j->reason_len, j->reason, v->job_reason);
}

static void vector_command(dev *d, const efs_fwvscenario *sc, size_t k, const efs_fwvstep *v)
{
	uint8_t *in = malloc(v->in_n);

	if (in == NULL) {
		abort();
	}
	memcpy(in, v->in, v->in_n);
	efs_fw_handle(&d->fw, (const uint8_t *)EFS_FWV_DEVICE, strlen(EFS_FWV_DEVICE), in, v->in_n, &d->r);
	if (d->r.reset) { /* the operator's: nothing to apply; the reason of a refusal is each side's own */
		fw_resets++;
		CHECK((int)d->r.verdict == v->verdict && d->r.epoch == v->epoch && d->r.mark.token == v->mark_token &&
			d->r.mark.seq == v->mark_seq && !d->r.apply && d->fw.last == EFS_FW_OK &&
			(v->verdict != EFS_ACCEPTED || strcmp(d->r.reason, v->reason) == 0),
			"%s, step %lu: reset: verdict %d mark %llu/%llu (%s); Go %d %llu/%llu (%s)", sc->name, (unsigned long)k,
			d->r.verdict, (unsigned long long)d->r.mark.token, (unsigned long long)d->r.mark.seq, d->r.reason,
			v->verdict, (unsigned long long)v->mark_token, (unsigned long long)v->mark_seq, v->reason);
		free(in);
		return;
	}
	CHECK((int)d->r.verdict == v->verdict && d->r.epoch == v->epoch && d->r.mark.token == v->mark_token &&
		d->r.mark.seq == v->mark_seq && d->r.apply == (v->verdict == EFS_ACCEPTED) &&
		(v->verdict != EFS_STALE || strcmp(d->r.reason, v->reason) == 0),
		"%s, step %lu: verdict %d mark %llu/%llu (%s); Go %d %llu/%llu (%s)",
		sc->name, (unsigned long)k, d->r.verdict, (unsigned long long)d->r.mark.token, (unsigned long long)d->r.mark.seq,
		d->r.reason, v->verdict, (unsigned long long)v->mark_token, (unsigned long long)v->mark_seq, v->reason);
	if (v->verdict == EFS_INVALID) {
		CHECK(d->fw.last == v->cls, "%s, step %lu: class %d, Go %d (%s; Go: %s)", sc->name, (unsigned long)k, d->fw.last, v->cls,
			d->r.reason, v->reason);
		size_t cn = strlen(d->r.reason); /* C's is cut at its buffer's size */
		int same = cn == sizeof d->r.reason - 1 ? strncmp(d->r.reason, v->reason, cn) == 0
						       : strcmp(d->r.reason, v->reason) == 0;

		size_t pre = v->cls == EFS_FW_E_MANIFEST ? auth_detail(v->reason) : 0;

		if (v->cls == EFS_FW_E_COMMAND && !same) {
			fw_body_wording++;
#ifdef EFS_FW_VERBOSE
			printf("wording: C \"%s\", Go \"%s\"\n", d->r.reason, v->reason);
#endif
		} else if (pre > 0 && !same) {
			fw_manifest_wording++;
			CHECK(strncmp(d->r.reason, v->reason, pre) == 0, "%s, step %lu: reason \"%s\", Go \"%s\"", sc->name,
				(unsigned long)k, d->r.reason, v->reason);
		} else {
			CHECK(same, "%s, step %lu: reason \"%s\", Go \"%s\"", sc->name, (unsigned long)k, d->r.reason,
				v->reason);
		}
	}
	free(in);
}

static void test_vectors(void)
{
	size_t steps = 0;

	factory = (const uint8_t *)EFS_FWV_FACTORY;
	factory_n = strlen(EFS_FWV_FACTORY);
	factory_security = EFS_FWV_SECURITY;
	for (size_t i = 0; i < EFS_FWVSCENARIOS_N; i++) {
		const efs_fwvscenario *sc = &efs_fwvscenarios[i];
		dev d;

		dev_init(&d, 0);
		if (sc->manifests) {
			d.fport.root_kid = (const uint8_t *)EFS_FWV_ROOT_KID;
			d.fport.root_kid_len = strlen(EFS_FWV_ROOT_KID);
			d.port.sha256 = lib_sha256;
			d.port.verify_root = root_verify;
		}
		if (sc->other) {
			d.fport.other = app_check;
		}
		for (size_t k = 0; k < sc->n; k++, steps++) {
			const efs_fwvstep *v = &sc->steps[k];

			if (v->boot) {
				CHECK(power_on(&d, v->healthy) == EFS_OK, "%s, step %lu: boot", sc->name, (unsigned long)k);
			} else {
				vector_command(&d, sc, k, v);
			}
			vector_state(&d, sc, k, v);
		}
		CHECK(d.f.violations == 0, "%s: flash violations", sc->name);
	}
#ifdef EFS_FW_CRYPTO
	const char *verify = "ES256 on mbedTLS";
#else
	const char *verify = "the digests Go verified";
#endif
	printf("firmware vectors: %lu scenarios, %lu steps, %d of them resets (the root's signatures: %s); %d body "
	       "refusals worded by Go's CBOR decoder (class compared), %d malformed manifests (compared to auth's sentinel)\n",
		(unsigned long)EFS_FWVSCENARIOS_N, (unsigned long)steps, fw_resets, verify, fw_body_wording,
		fw_manifest_wording);
	factory = NULL;
	factory_n = FACTORY_SIZE;
	factory_security = 2;
}
