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

/* run_step takes step i of the job: a command at token 7, seq i + 1, or
 * the reboot into the trial. */
static efs_verdict run_step(dev *d, int i)
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
	return send(d, &c, 7, (uint64_t)i + 1);
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
