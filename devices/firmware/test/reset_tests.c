/*
 * The operator's resets (included by host.c): every reset vector from the
 * Go fence point (verdict, state, ack), then a power cut at every byte of a
 * reset's write (the previous state, counter and epoch, or the new ones,
 * never anything else), and the slot formats (format 1 until the first
 * reset, format 3 with its counter and epoch after it; format 2, an older
 * library's reset without an epoch, still read and kept).
 */

#if !defined(EFS_NO_CRYPTO)
/* reset_rig powers up v's device on fresh flash with the root's port and
 * applies v's prime and first reset. */
static void reset_rig(rig *d, const efs_vreset *v)
{
	size_t pn, bn, dn;
	uint8_t *prime = blob(&v->prime, &pn), *before = blob(&v->before, &bn), *dev = blob(&v->device, &dn);

	flash_init(&d->f, &d->port);
	d->port.sha256 = port_sha256;
	d->port.verify_root = port_verify_root;
	CHECK(efs_open(&d->c, &d->port) == EFS_OK, "reset %s: open", v->name);
	efs_handle(&d->c, (const uint8_t *)"dev-r", 5, prime, pn, &d->r);
	CHECK(d->r.verdict == EFS_ACCEPTED && !d->r.reset, "reset %s: prime %s", v->name, d->r.reason);
	if (bn > 0) {
		efs_handle(&d->c, (const uint8_t *)"dev-r", 5, before, bn, &d->r);
		CHECK(d->r.verdict == EFS_ACCEPTED && d->r.reset && !d->r.apply, "reset %s: first reset %s", v->name,
			d->r.reason);
		CHECK(power_on(&d->f, &d->c, &d->port) == EFS_OK && d->c.reset_counter > 0 && d->c.reset_epoch > 0,
			"reset %s: reopen", v->name);
	}
	free(prime);
	free(before);
	free(dev);
}

static void test_reset_vectors(void)
{
	for (size_t i = 0; i < EFS_VRESETS_N; i++) {
		const efs_vreset *v = &efs_vresets[i];
		rig d;
		efs_ack a;
		uint8_t out[EFS_MAX_ACK_SIZE];
		size_t n, dn, len;
		uint8_t *in = blob(&v->in, &n), *dev = blob(&v->device, &dn);
		uint64_t counter;
		efs_err e;

		reset_rig(&d, v);
		counter = d.c.reset_counter;
		efs_handle(&d.c, dev, dn, in, n, &d.r);
		CHECK((int)d.r.verdict == v->verdict && d.r.epoch == v->epoch && d.r.mark.token == v->mark_token &&
			d.r.mark.seq == v->mark_seq && !d.r.apply, "reset %s: verdict %d e%llu mark %llu/%llu (%s), want %d e%llu %llu/%llu",
			v->name, d.r.verdict, (unsigned long long)d.r.epoch, (unsigned long long)d.r.mark.token,
			(unsigned long long)d.r.mark.seq, d.r.reason, v->verdict, (unsigned long long)v->epoch,
			(unsigned long long)v->mark_token, (unsigned long long)v->mark_seq);
		efs_result_ack(&d.r, &a);
		ack_reason_blank(&d.r, &a);
		e = efs_encode_ack(&a, out, sizeof out, &len);
		CHECK(e == EFS_OK && blob_equal(&v->ack, (efs_bytes){ out, len }), "reset %s: ack differs (%s; %s)",
			v->name, efs_strerror(e), d.r.reason);
		/* Durable: a reboot has the state the ack says, and the counter
		 * moved only with an accepted reset, its epoch with it. */
		CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK && (v->verdict == EFS_INVALID ||
			(d.c.mark.token == v->mark_token && d.c.mark.seq == v->mark_seq && d.c.epoch == v->epoch &&
				d.c.reset_epoch == v->epoch && d.c.reset_counter > counter)) &&
			(v->verdict != EFS_INVALID || d.c.reset_counter == counter), "reset %s: after a reboot", v->name);
		CHECK(d.f.violations == 0, "reset %s: a byte programmed twice", v->name);
		free(in);
		free(dev);
	}
}

static const efs_vreset *reset_vector(const char *name)
{
	for (size_t i = 0; i < EFS_VRESETS_N; i++) {
		if (strcmp(efs_vresets[i].name, name) == 0) {
			return &efs_vresets[i];
		}
	}
	abort();
}

#ifndef EFS_MCU_MBEDTLS /* the power cuts: hundreds of verifies, on the host */
/* reset_tear cuts the power at byte k of v's reset (the "next counter"
 * one, over the prime and a first reset; or the first reset, over the
 * prime alone) and checks what a reboot finds; 1 if the write finished. */
static int reset_tear(const efs_vreset *v, long k, uint8_t torn_bits)
{
	rig d;
	size_t n;
	uint8_t *in = blob(&v->in, &n);
	efs_mark old;
	uint64_t old_counter, old_epoch, old_reset_epoch;
	int accepted;

	reset_rig(&d, v);
	old = d.c.mark;
	old_counter = d.c.reset_counter;
	old_epoch = d.c.epoch;
	old_reset_epoch = d.c.reset_epoch;
	d.f.programmed = 0;
	d.f.program_budget = k;
	d.f.torn_bits = torn_bits;
	efs_handle(&d.c, (const uint8_t *)"dev-r", 5, in, n, &d.r);
	accepted = d.r.verdict == EFS_ACCEPTED;
	CHECK(accepted || d.r.err == EFS_E_STORAGE, "reset tear at %ld: verdict %d (%s)", k, d.r.verdict, d.r.reason);
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK, "reset tear at %ld (bits %02x): reopen refused", k, torn_bits);
	if (accepted) { /* acked accepted: on flash */
		CHECK(d.c.mark.token == v->mark_token && d.c.mark.seq == v->mark_seq && d.c.reset_counter > old_counter &&
			d.c.epoch == v->epoch && d.c.reset_epoch == v->epoch, "reset tear at %ld: accepted but lost", k);
	} else { /* the previous state, counter and epoch, or the new ones: never a mix */
		int was = d.c.mark.token == old.token && d.c.mark.seq == old.seq && d.c.reset_counter == old_counter &&
			d.c.epoch == old_epoch && d.c.reset_epoch == old_reset_epoch;
		int now = d.c.mark.token == v->mark_token && d.c.mark.seq == v->mark_seq && d.c.reset_counter > old_counter &&
			d.c.epoch == v->epoch && d.c.reset_epoch == v->epoch;
		CHECK(was || now, "reset tear at %ld (bits %02x): mark %llu/%llu counter %llu", k, torn_bits,
			(unsigned long long)d.c.mark.token, (unsigned long long)d.c.mark.seq,
			(unsigned long long)d.c.reset_counter);
	}
	/* Resent: applied once, then a replay. */
	old_counter = d.c.reset_counter;
	efs_handle(&d.c, (const uint8_t *)"dev-r", 5, in, n, &d.r);
	CHECK((old_counter == 0 || d.c.reset_counter != old_counter || d.r.verdict == EFS_INVALID) &&
		(d.r.verdict == EFS_ACCEPTED || d.r.err == EFS_E_RESET_REPLAY), "reset tear at %ld: resend %d (%s)", k,
		d.r.verdict, d.r.reason);
	efs_handle(&d.c, (const uint8_t *)"dev-r", 5, in, n, &d.r);
	CHECK(d.r.verdict == EFS_INVALID && d.r.err == EFS_E_RESET_REPLAY, "reset tear at %ld: replay %d", k,
		d.r.verdict);
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK && d.c.mark.token == v->mark_token &&
		d.c.mark.seq == v->mark_seq, "reset tear at %ld: mark after the resend", k);
	CHECK(d.f.violations == 0, "reset tear at %ld: a byte programmed twice", k);
	free(in);
	return accepted;
}

static void test_reset_tears(void)
{
	static const uint8_t bits[] = { 0xff, 0x0f, 0xf0, 0x00 };
	static const char *const names[] = { "next counter", "down to 2/1" };
	long k;

	for (size_t i = 0; i < 2; i++) {
		for (size_t b = 0; b < sizeof bits; b++) {
			for (k = 0; k < 1000 && !reset_tear(reset_vector(names[i]), k, bits[b]); k++) {
			}
			CHECK(k > 40 && k < 1000, "reset tears: write finished after %ld bytes", k);
		}
	}
}

#endif

/* to_format2 rewrites sector s's format 3 slot as an older library wrote
 * a reset of epoch 0 (format 2: no reset epoch; its mark record as it is). */
static void to_format2(flash *f, unsigned s)
{
	uint8_t *b = f->mem[s];
	size_t l = b[6], at = 15 + l;
	uint32_t crc;

	b[5] = 0;
	memset(b + at, 0xff, 12); /* the epoch and the old CRC */
	crc = efs_crc32c(b + 1, at - 1);
	for (int k = 0; k < 4; k++) {
		b[at + (size_t)k] = (uint8_t)(crc >> (24 - 8 * k));
	}
}

/* test_reset_formats: format 1 until the first reset, format 3 after it
 * (read back after every write); a damaged counter or epoch fails the
 * slot; an older library's format 2 is read (its reset of epoch 0) and
 * written again while no newer reset came. */
static void test_reset_formats(void)
{
	rig d;
	const efs_vreset *v = reset_vector("next counter");
	size_t l;

	reset_rig(&d, reset_vector("up to 9/4")); /* the prime only: format 1 */
	CHECK(d.c.cur == 0 && d.f.mem[0][5] >= 31 && d.c.reset_counter == 0, "format 1 before any reset: %u",
		d.f.mem[0][5]);
	reset_rig(&d, v); /* prime, then the first reset: format 3 in sector 1 */
	l = d.f.mem[1][6];
	CHECK(d.c.cur == 1 && d.f.mem[1][5] == 1 && d.c.reset_counter == 3 && d.c.reset_epoch == 3 && d.c.epoch == 3 &&
		d.f.mem[1][7] == 2, "format 3 after a reset: %u, counter %llu, epoch %llu, record version %u", d.f.mem[1][5],
		(unsigned long long)d.c.reset_counter, (unsigned long long)d.c.reset_epoch, d.f.mem[1][7]);
	to_format2(&d.f, 1);
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK && d.c.cur == 1 && d.c.reset_counter == 3 && d.c.reset_epoch == 0 &&
		d.c.epoch == 3 && efs_state_of(&d.c).epoch == 3, "an older library's format 2: read, its mark's epoch 3");
	send_at(&d.c, "dev-r", 3, 2, 2, &d.r);
	CHECK(d.r.apply && d.c.cur == 0 && d.f.mem[0][5] == 0 && d.f.mem[0][7] == 2 && d.c.reset_counter == 3 &&
		power_on(&d.f, &d.c, &d.port) == EFS_OK && d.c.reset_epoch == 0 && d.c.epoch == 3,
		"a command after a format 2 reset: format 2 again (%s)", d.r.reason);
	reset_rig(&d, v);
	d.f.mem[1][7 + l + 7] ^= 0x01; /* the counter's last byte */
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_E_CORRUPT && d.c.corrupt,
		"a damaged counter: the slot is not read, and the older one is superseded: fail closed");
	d.f.mem[0][SECTOR - 1] = 0xff; /* an older library's flash: the old rule, the valid slot */
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK && d.c.cur == 0 && d.c.reset_counter == 0 && d.c.epoch == 0,
		"a damaged counter on an older library's flash: the valid slot");
	reset_rig(&d, v);
	d.f.mem[1][7 + l + 15] ^= 0x80; /* the epoch's last byte */
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_E_CORRUPT && d.c.corrupt, "a damaged reset epoch: fail closed");
}
#endif

static void test_resets(void)
{
#if defined(EFS_NO_CRYPTO)
	printf("reset vectors: %d not run (no crypto port in this build)\n", (int)EFS_VRESETS_N);
#elif defined(EFS_MCU_MBEDTLS)
	/* every vector, each one to three verifies (~27 M instructions each
	 * here); the tears (hundreds of verifies) run on the host */
	test_reset_vectors();
	test_reset_formats();
	printf("reset vectors: %d run on this target, ES256 on mbedTLS (the power cuts run on the host)\n",
		(int)EFS_VRESETS_N);
#else
	test_reset_vectors();
	test_reset_tears();
	test_reset_formats();
#endif
}
