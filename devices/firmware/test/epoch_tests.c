/*
 * Epochs (included by host.c): the epoch scenarios of the Go fence point
 * (testdata/vectors.h, efs_vepochs: commands and resets at a fleet epoch,
 * answered by devices/shim), each step's verdict, state and ack, and the
 * state a reboot finds; a power cut at every byte of a command's write in
 * the epoch a reset opened (format 3, a mark record of version 2); the
 * reasons' numbers at their edges; a plain device ignores the port's fleet
 * epoch.
 */

/* The port's fleet epoch: what the trust layer would hold. */
static uint64_t fleet_now;

static uint64_t fleet_epoch(void *user)
{
	(void)user;
	return fleet_now;
}

/* state_is checks the device's state after a reboot against want. */
static int state_is(rig *d, uint64_t epoch, uint64_t token, uint64_t seq)
{
	efs_state st;

	if (power_on(&d->f, &d->c, &d->port) != EFS_OK) {
		return 0;
	}
	st = efs_state_of(&d->c);
	return st.epoch == epoch && st.mark.token == token && st.mark.seq == seq;
}

#if !defined(EFS_NO_CRYPTO)
/* epoch_step runs step k of scenario sc on d and checks it against Go's. */
static void epoch_step(rig *d, const efs_vepoch *sc, size_t k)
{
	const efs_vestep *v = &sc->steps[k];
	efs_ack a;
	uint8_t out[EFS_MAX_ACK_SIZE];
	size_t n, len;
	uint8_t *in = blob(&v->in, &n);
	efs_err e;

	fleet_now = v->fleet;
	efs_handle(&d->c, (const uint8_t *)"dev-e", 5, in, n, &d->r);
	CHECK((int)d->r.verdict == v->verdict && d->r.epoch == v->epoch && d->r.mark.token == v->mark_token &&
		d->r.mark.seq == v->mark_seq && d->r.apply == (v->verdict == EFS_ACCEPTED && !d->r.reset),
		"epoch %s, step %lu: verdict %d e%llu %llu/%llu (%s), want %d e%llu %llu/%llu", sc->name, (unsigned long)k, d->r.verdict,
		(unsigned long long)d->r.epoch, (unsigned long long)d->r.mark.token, (unsigned long long)d->r.mark.seq,
		d->r.reason, v->verdict, (unsigned long long)v->epoch, (unsigned long long)v->mark_token,
		(unsigned long long)v->mark_seq);
	efs_result_ack(&d->r, &a);
	ack_reason_blank(&d->r, &a);
	e = efs_encode_ack(&a, out, sizeof out, &len);
	CHECK(e == EFS_OK && blob_equal(&v->ack, (efs_bytes){ out, len }), "epoch %s, step %lu: ack differs (%s)",
		sc->name, (unsigned long)k, d->r.reason);
	CHECK(state_is(d, v->epoch, v->mark_token, v->mark_seq), "epoch %s, step %lu: after a reboot e%llu %llu/%llu",
		sc->name, (unsigned long)k, (unsigned long long)d->c.epoch, (unsigned long long)d->c.mark.token,
		(unsigned long long)d->c.mark.seq);
	free(in);
}

static void test_epoch_vectors(void)
{
	for (size_t i = 0; i < EFS_VEPOCHS_N; i++) {
		const efs_vepoch *sc = &efs_vepochs[i];
		rig d;

		flash_init(&d.f, &d.port);
		d.port.sha256 = port_sha256;
		d.port.verify_root = port_verify_root;
		d.port.epoch = fleet_epoch; /* counts only with verify: signed commands */
		if (sc->signed_cmds) {
			d.port.verify = port_verify;
		}
		CHECK(efs_open(&d.c, &d.port) == EFS_OK, "epoch %s: open", sc->name);
		for (size_t k = 0; k < sc->n; k++) {
			epoch_step(&d, sc, k);
		}
		CHECK(d.f.violations == 0, "epoch %s: a byte programmed twice", sc->name);
	}
	fleet_now = 0;
}

#ifndef EFS_MCU_MBEDTLS
/* epoch_tear cuts the power at byte k of the write of a command of epoch 3
 * (3/1) after the reset "down to 2/1" (counter 3, epoch 3): a reboot finds
 * the reset's state or the command's, the reset's counter and epoch kept;
 * 1 if the write finished. */
static int epoch_tear(long k, uint8_t torn_bits)
{
	const efs_vreset *v = reset_vector("down to 2/1");
	rig d;
	size_t n;
	uint8_t *in = blob(&v->in, &n);
	int applied;

	reset_rig(&d, v);
	efs_handle(&d.c, (const uint8_t *)"dev-r", 5, in, n, &d.r);
	free(in);
	CHECK(d.r.verdict == EFS_ACCEPTED && d.c.epoch == 3, "epoch tear: the reset %s", d.r.reason);
	d.f.programmed = 0;
	d.f.program_budget = k;
	d.f.torn_bits = torn_bits;
	send_at(&d.c, "dev-r", 3, 3, 1, &d.r);
	applied = d.r.apply;
	CHECK(applied || d.r.err == EFS_E_STORAGE, "epoch tear at %ld: %d (%s)", k, d.r.verdict, d.r.reason);
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK && d.c.reset_counter == 3 && d.c.reset_epoch == 3 &&
		d.c.epoch == 3 && (d.c.mark.token == 3 || (!applied && d.c.mark.token == 2)) && d.c.mark.seq == 1,
		"epoch tear at %ld (bits %02x): e%llu %llu/%llu, reset %llu e%llu", k, torn_bits,
		(unsigned long long)d.c.epoch, (unsigned long long)d.c.mark.token, (unsigned long long)d.c.mark.seq,
		(unsigned long long)d.c.reset_counter, (unsigned long long)d.c.reset_epoch);
	CHECK(send_at(&d.c, "dev-r", 0, 9, 1, &d.r) == EFS_STALE && send_at(&d.c, "dev-r", 3, 3, 2, &d.r) == EFS_ACCEPTED &&
		state_is(&d, 3, 3, 2) && d.f.violations == 0, "epoch tear at %ld: the device goes on", k);
	return applied;
}

static void test_epoch_tears(void)
{
	static const uint8_t bits[] = { 0xff, 0x0f, 0x00 };
	long k;

	for (size_t b = 0; b < sizeof bits; b++) {
		for (k = 0; k < 1000 && !epoch_tear(k, bits[b]); k++) {
		}
		CHECK(k > 40 && k < 1000, "epoch tears: write finished after %ld bytes", k);
	}
}
#endif
#endif

/* test_epoch_reasons: a device put at an epoch (as a reset would: its
 * epoch in the context) words its refusals by epoch as Go does, numbers at
 * the edges of each 16-bit digit; a plain device ignores the port's fleet
 * epoch; the state a refusal reports is the device's. */
static void test_epoch_reasons(void)
{
	static const uint64_t epochs[] = { 1, 10, 65536, 4294967296u, 18446744073709551615u };
	char want[EFS_MAX_REASON_LEN];
	rig d;

	for (size_t i = 0; i < sizeof epochs / sizeof epochs[0]; i++) {
		rig_start(&d, 1);
		d.c.reset_epoch = epochs[i];
		send_at(&d.c, "dev", epochs[i] - 1, 9, 1, &d.r);
		snprintf(want, sizeof want, "epoch %llu closed: the fence point is at epoch %llu",
			(unsigned long long)(epochs[i] - 1), (unsigned long long)epochs[i]);
		CHECK(d.r.verdict == EFS_STALE && strcmp(d.r.reason, want) == 0 && d.r.epoch == epochs[i] &&
			d.r.mark.token == 0, "stale by epoch: %s, want %s", d.r.reason, want);
		if (epochs[i] == UINT64_MAX) {
			continue;
		}
		send_at(&d.c, "dev", epochs[i] + 1, 9, 1, &d.r);
		snprintf(want, sizeof want, "unknown epoch %llu: the fence point is at epoch %llu",
			(unsigned long long)(epochs[i] + 1), (unsigned long long)epochs[i]);
		CHECK(d.r.verdict == EFS_INVALID && d.r.err == EFS_E_UNKNOWN_EPOCH && strcmp(d.r.reason, want) == 0 &&
			!d.r.apply, "unknown epoch: %s, want %s", d.r.reason, want);
	}
	rig_start(&d, 1);
	d.port.epoch = fleet_epoch;
	fleet_now = 4;
	CHECK(send_at(&d.c, "dev", 0, 5, 2, &d.r) == EFS_ACCEPTED && d.r.epoch == 0 &&
		send_at(&d.c, "dev", 4, 5, 3, &d.r) == EFS_INVALID && d.r.err == EFS_E_UNKNOWN_EPOCH,
		"a plain device: the port's fleet epoch does not count (%s)", d.r.reason);
	fleet_now = 0;
}

static void test_epochs(void)
{
	test_epoch_reasons();
#if defined(EFS_NO_CRYPTO)
	printf("epoch vectors: %d scenarios not run (no crypto port in this build)\n", (int)EFS_VEPOCHS_N);
#else
	test_epoch_vectors();
#ifndef EFS_MCU_MBEDTLS
	test_epoch_tears();
#endif
#endif
}
