/*
 * Power cuts through a whole firmware job (included by fw_host.c): the job
 * begin, 4 chunks, install, activate, a reboot into the trial, commit. For
 * every step, the power is cut at every byte it programs (slot data, job
 * record, mark), the torn byte left as it was, fully programmed or half,
 * and through its erases every 61 bytes. After each cut the device boots:
 * the slot it runs holds the image the boot loader names (no half-written
 * image is ever booted), the mark and the job record's tag agree (the
 * reconciliation), a step reported applied survived, and the job,
 * resending the cut step, goes on to commit the new image.
 */

enum { N_STEPS = 9, STEP_REBOOT = 7 };

/* EFS_FW_TEAR_STRIDE: cut at every byte (1, the host) or every n-th (the
 * Cortex-M runner under QEMU, mcu/fw_runner.c). */
#ifndef EFS_FW_TEAR_STRIDE
#define EFS_FW_TEAR_STRIDE 1
#endif

static efs_verdict run_step_at(dev *d, int i, uint64_t token, uint64_t seq);

/* run_step takes step i of the job: a command at token 7, seq i + 1, or
 * the reboot into the trial. */
static efs_verdict run_step(dev *d, int i)
{
	return run_step_at(d, i, 7, (uint64_t)i + 1);
}

/* run_step_at takes step i at token and seq. */
static efs_verdict run_step_at(dev *d, int i, uint64_t token, uint64_t seq)
{
	cmd c;

	switch (i) {
	case 0:
		begin_body(&c, "j1", image_sum, IMAGE_SIZE, 3, CHUNK);
		break;
	case 1:
	case 2:
	case 3:
	case 4: {
		uint64_t off = (uint64_t)(i - 1) * CHUNK;
		chunk_body(&c, "j1", off, image + off, IMAGE_SIZE - off < CHUNK ? IMAGE_SIZE - off : CHUNK);
		break;
	}
	case 5:
		job_body(&c, "fw.install", "j1");
		break;
	case 6:
		job_body(&c, "fw.activate", "j1");
		break;
	case STEP_REBOOT:
		return power_on(d, 1) == EFS_OK ? EFS_ACCEPTED : EFS_INVALID;
	default:
		job_body(&c, "fw.commit", "j1");
		break;
	}
	return send(d, &c, token, seq);
}

/* booted_ok checks what a boot after a cut must give. */
static void booted_ok(dev *d, int i, long k, const char *how)
{
	uint8_t s[32];

	sum(d->f.mem[4 + d->boot.slot], (size_t)d->boot.size, s);
	CHECK(d->boot.slot <= 1 && d->boot.size <= SLOT && memcmp(s, d->boot.image, 32) == 0 &&
		(memcmp(s, factory_sum, 32) == 0 || memcmp(s, image_sum, 32) == 0),
		"step %d, %s %ld: booted slot %u does not hold its image", i, how, k, d->boot.slot);
	CHECK(d->c.mark.token == d->fw.job.token && d->c.mark.seq == d->fw.job.seq,
		"step %d, %s %ld: mark %llu/%llu, job record's tag %llu/%llu", i, how, k,
		(unsigned long long)d->c.mark.token, (unsigned long long)d->c.mark.seq,
		(unsigned long long)d->fw.job.token, (unsigned long long)d->fw.job.seq);
}

static long tears_applied, tears_lost;

/* cut_run runs the job with the power cut in step i (program or erase
 * budget), reboots, checks, and finishes the job. */
static void cut_run(int i, long program_budget, long erase_budget, uint8_t torn_bits, const char *how, long k)
{
	dev d;
	uint64_t prev;
	int applied;

	dev_init(&d, 5);
	for (int s = 0; s < i; s++) {
		run_step(&d, s);
	}
	prev = d.fw.job.seq;
	d.f.programmed = d.f.erased = 0;
	d.f.program_budget = program_budget;
	d.f.erase_budget = erase_budget;
	d.f.torn_bits = torn_bits;
	run_step(&d, i);
	applied = i != STEP_REBOOT && d.r.apply;
	CHECK(power_on(&d, 1) == EFS_OK, "step %d, %s %ld: no boot after the cut", i, how, k);
	booted_ok(&d, i, k, how);
	if (i != STEP_REBOOT) {
		CHECK(applied ? d.fw.job.seq == (uint64_t)i + 1 : d.fw.job.seq == prev || d.fw.job.seq == (uint64_t)i + 1,
			"step %d, %s %ld: applied %d, job record at seq %llu", i, how, k, applied,
			(unsigned long long)d.fw.job.seq);
		if (d.fw.job.seq == (uint64_t)i + 1) {
			tears_applied++;
		} else {
			tears_lost++;
		}
	}
	for (int s = i; s < N_STEPS; s++) { /* resend the cut step (a duplicate if it happened), go on */
		efs_verdict v = run_step(&d, s);
		CHECK(v == EFS_ACCEPTED || (s == i && v == EFS_DUPLICATE && d.fw.job.seq == (uint64_t)i + 1),
			"step %d, %s %ld: then step %d: verdict %d (%s)", i, how, k, s, v, d.r.reason);
	}
	CHECK(d.fw.job.state == EFS_FW_COMMITTED && d.fw.boot.active == 1 && d.fw.boot.security == 3,
		"step %d, %s %ld: the job ended %s", i, how, k, efs_fw_state_name(d.fw.job.state));
	CHECK(power_on(&d, 1) == EFS_OK && d.boot.slot == 1 && !d.boot.trial && memcmp(d.boot.image, image_sum, 32) == 0,
		"step %d, %s %ld: the committed image does not boot", i, how, k);
	CHECK(d.f.violations == 0, "step %d, %s %ld: %d flash violations", i, how, k, d.f.violations);
}

static void test_tears(void)
{
	static const uint8_t bits[] = { 0xff, 0x00, 0x5a };
	long programs[N_STEPS], erases[N_STEPS], cuts = 0;
	dev d;

	dev_init(&d, 5);
	for (int i = 0; i < N_STEPS; i++) { /* the reference: what each step writes */
		d.f.programmed = d.f.erased = 0;
		CHECK(run_step(&d, i) == EFS_ACCEPTED, "reference step %d: %s", i, d.r.reason);
		programs[i] = d.f.programmed;
		erases[i] = d.f.erased;
	}
	CHECK(d.fw.job.state == EFS_FW_COMMITTED, "reference: %s", efs_fw_state_name(d.fw.job.state));
	for (int i = 0; i < N_STEPS; i++) {
		for (long k = 0; k < programs[i]; k += EFS_FW_TEAR_STRIDE) {
			for (size_t b = 0; b < sizeof bits; b++, cuts++) {
				cut_run(i, k, -1, bits[b], "program cut at byte", k);
			}
		}
		for (long e = 0; e < erases[i]; e += 61, cuts++) {
			cut_run(i, -1, e, 0xff, "erase cut at byte", e);
		}
	}
	printf("power cuts: %ld (9 steps: each programmed byte at stride %d x 3 torn values, erases every 61 bytes); "
		"step survived %ld, step lost %ld\n", cuts, EFS_FW_TEAR_STRIDE, tears_applied, tears_lost);
}

/*
 * An operator's reset on the firmware device mid-job (efs_fw_handle), the
 * power cut at every byte of its write, then at every byte of the first
 * step after it: the job at token 7 is in its download (begin, two
 * chunks, mark 7/3), the reset lowers the mark to 2/1 (counter 1), a
 * holder at token 3 finishes the job. After every cut the device boots
 * with the old mark and counter or the reset's (never the reset's counter
 * with the mark rolled back up to the job record's tag 7/3), a reset acked
 * accepted survived, the reset resent is applied once, and the job goes
 * on to commit under token 3. The signature is not what is tested here:
 * the port's root takes this statement (tear_root).
 */
static const char tear_root_kid[] = "root-t";

static int tear_root(void *user, const uint8_t *kid, size_t kid_len, const uint8_t digest[32], const uint8_t sig[64])
{
	(void)user;
	(void)digest;
	(void)sig;
	return kid_len == strlen(tear_root_kid) && memcmp(kid, tear_root_kid, kid_len) == 0 ? EFS_PORT_OK
												: EFS_PORT_UNKNOWN_KEY;
}

/* tear_reset writes a reset of "dev" to (token, seq) with counter, into
 * epoch counter: a COSE_Sign1 as fence/auth's, its signature 64 zero
 * bytes. */
static size_t tear_reset(uint8_t *out, uint64_t token, uint64_t seq, uint64_t counter)
{
	uint8_t prot[80], pay[80], sig[64] = { 0 };
	size_t pn = 0, yn = 0, n = 0;

	pn += put_head(prot + pn, 5, 3);
	pn += put_head(prot + pn, 0, 1);
	pn += put_head(prot + pn, 1, 6);
	pn += put_head(prot + pn, 0, 3);
	pn += put_text(prot + pn, EFS_RESET_CONTENT);
	pn += put_head(prot + pn, 0, 4);
	pn += put_str(prot + pn, 2, tear_root_kid, strlen(tear_root_kid));
	yn += put_head(pay + yn, 5, 6);
	yn += put_head(pay + yn, 0, 1);
	yn += put_text(pay + yn, "dev");
	yn += put_head(pay + yn, 0, 2);
	yn += put_head(pay + yn, 0, token);
	yn += put_head(pay + yn, 0, 3);
	yn += put_head(pay + yn, 0, seq);
	yn += put_head(pay + yn, 0, 4);
	yn += put_head(pay + yn, 0, counter);
	yn += put_head(pay + yn, 0, 5);
	yn += put_text(pay + yn, "reset:tear");
	yn += put_head(pay + yn, 0, 7);
	yn += put_head(pay + yn, 0, counter); /* the epoch: the counter */
	out[n++] = 0xd2;
	n += put_head(out + n, 4, 4);
	n += put_str(out + n, 2, prot, pn);
	n += put_head(out + n, 5, 0);
	n += put_str(out + n, 2, pay, yn);
	n += put_str(out + n, 2, sig, sizeof sig);
	return n;
}

/* reset_dev is a device with the root, the job at token 7 three steps in. */
static void reset_dev(dev *d)
{
	dev_init(d, 5);
	d->port.sha256 = lib_sha256;
	d->port.verify_root = tear_root;
	for (int s = 0; s < 3; s++) {
		run_step(d, s);
	}
}

static int send_reset(dev *d, const uint8_t *in, size_t n)
{
	efs_fw_handle(&d->fw, (const uint8_t *)"dev", 3, in, n, &d->r);
	d->epoch = 1; /* the holder's commands after the reset: in its epoch */
	return d->r.reset && d->r.verdict == EFS_ACCEPTED;
}

/* after_reset checks the boot after a cut: the reset's mark and counter
 * (reset 1) or the old ones, and a mark that equals the record's tag when
 * the record is of the mark's counter. */
static void reset_booted(dev *d, int reset, const char *what, long k)
{
	CHECK(reset ? d->c.mark.token == 2 && d->c.mark.seq == 1 && d->c.reset_counter == 1 && d->c.epoch == 1 &&
			d->c.reset_epoch == 1
		    : d->c.mark.token == 7 && d->c.mark.seq == 3 && d->c.reset_counter == 0 && d->c.epoch == 0,
		"%s %ld: reset %d, mark %llu/%llu counter %llu", what, k, reset, (unsigned long long)d->c.mark.token,
		(unsigned long long)d->c.mark.seq, (unsigned long long)d->c.reset_counter);
	CHECK(d->fw.job.counter != d->c.reset_counter ||
		(d->fw.job.token == d->c.mark.token && d->fw.job.seq == d->c.mark.seq),
		"%s %ld: mark %llu/%llu, the record's tag %llu/%llu under the same counter", what, k,
		(unsigned long long)d->c.mark.token, (unsigned long long)d->c.mark.seq, (unsigned long long)d->fw.job.token,
		(unsigned long long)d->fw.job.seq);
}

/* finish_after_reset takes the job to commit under token 3 from step
 * from (seq from - 2) and checks it boots. */
static void finish_after_reset(dev *d, int from, const char *what, long k)
{
	for (int s = from; s < N_STEPS; s++) {
		efs_verdict v = run_step_at(d, s, 3, (uint64_t)s - 2);
		CHECK(v == EFS_ACCEPTED || (s == from && v == EFS_DUPLICATE), "%s %ld: step %d at token 3: %d (%s)", what,
			k, s, v, d->r.reason);
	}
	CHECK(d->fw.job.state == EFS_FW_COMMITTED && power_on(d, 1) == EFS_OK && d->boot.slot == 1 &&
		memcmp(d->boot.image, image_sum, 32) == 0, "%s %ld: the job did not commit after the reset", what, k);
	CHECK(d->f.violations == 0, "%s %ld: %d flash violations", what, k, d->f.violations);
	d->epoch = 0; /* the holder of epoch 0, captured before the reset, replayed: stale */
	CHECK(run_step_at(d, 8, 7, 9) == EFS_STALE && d->r.epoch == 1, "%s %ld: a command of epoch 0 after the reset: %d",
		what, k, d->r.verdict);
}

static long reset_cuts;

/* reset_cut cuts the reset's write at byte k; 1 once it finished. */
static int reset_cut(const uint8_t *in, size_t n, long k, uint8_t torn_bits)
{
	dev d;
	int acked, applied;

	reset_dev(&d);
	d.f.programmed = 0;
	d.f.program_budget = k;
	d.f.torn_bits = torn_bits;
	acked = send_reset(&d, in, n);
	reset_cuts++;
	CHECK(power_on(&d, 1) == EFS_OK, "reset cut at %ld: no boot", k);
	applied = d.c.reset_counter == 1;
	CHECK(applied || !acked, "reset cut at %ld: acked accepted, lost", k);
	reset_booted(&d, applied, "reset cut at", k);
	CHECK(send_reset(&d, in, n) == !applied && (applied ? d.r.err == EFS_E_RESET_REPLAY : 1),
		"reset cut at %ld: resent: %d (%s)", k, d.r.verdict, d.r.reason);
	CHECK(power_on(&d, 1) == EFS_OK, "reset cut at %ld: no boot after the resend", k);
	reset_booted(&d, 1, "reset cut, resent, rebooted, at", k);
	finish_after_reset(&d, 3, "reset cut at", k);
	return acked;
}

/* step_cut cuts the first step after the reset (chunk 2 at token 3: its
 * record is the first of counter 1) at byte k; 1 once it finished. */
static int step_cut(const uint8_t *in, size_t n, long k, uint8_t torn_bits)
{
	dev d;
	int applied;

	reset_dev(&d);
	CHECK(send_reset(&d, in, n), "step cut at %ld: the reset: %s", k, d.r.reason);
	d.f.programmed = d.f.erased = 0;
	d.f.program_budget = k;
	d.f.torn_bits = torn_bits;
	applied = run_step_at(&d, 3, 3, 1) == EFS_ACCEPTED;
	reset_cuts++;
	CHECK(power_on(&d, 1) == EFS_OK, "step cut at %ld: no boot", k);
	CHECK(d.c.reset_counter == 1 && (d.fw.job.seq == 1 ? d.c.mark.token == 3 && d.c.mark.seq == 1
							  : !applied && d.c.mark.token == 2 && d.c.mark.seq == 1),
		"step cut at %ld: applied %d, mark %llu/%llu, job seq %llu", k, applied, (unsigned long long)d.c.mark.token,
		(unsigned long long)d.c.mark.seq, (unsigned long long)d.fw.job.seq);
	finish_after_reset(&d, 3, "step cut at", k);
	return applied;
}

static void test_reset_tears(void)
{
	static const uint8_t bits[] = { 0xff, 0x00, 0x5a };
	uint8_t in[256];
	size_t n = tear_reset(in, 2, 1, 1);
	long k, reset_bytes = 0, step_bytes = 0;

	for (size_t b = 0; b < sizeof bits; b++) {
		for (k = 0; k < 4000 && !reset_cut(in, n, k, bits[b]); k += EFS_FW_TEAR_STRIDE) {
		}
		CHECK(k > 20 && k < 4000, "reset tears: the reset's write finished after %ld bytes", k);
		reset_bytes = k;
		for (k = 0; k < 4000 && !step_cut(in, n, k, bits[b]); k += EFS_FW_TEAR_STRIDE) {
		}
		CHECK(k > 100 && k < 4000, "reset tears: the step's writes finished after %ld bytes", k);
		step_bytes = k;
	}
	printf("reset on the firmware device: %ld power cuts (the reset's %ld bytes and the next step's %ld, at "
	       "stride %d x 3 torn values)\n", reset_cuts, reset_bytes, step_bytes, EFS_FW_TEAR_STRIDE);
}
