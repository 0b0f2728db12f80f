/*
 * Rot in the job record (included by fw_host.c, after fw_tears.c): bits
 * flipped after complete steps, not a cut. Every byte of a record but its
 * commit byte (every EFS_FW_TEAR_STRIDE-th on Cortex-M), two bits each.
 * The newest record damaged: efs_fw_open fails closed (the older record is
 * a step behind the mark: the job would step back under a step applied);
 * the older one: the newest is used and the job goes on to commit; both:
 * fail closed. Then a cut at the superseded byte: the next open marks it
 * (efs_fw_open, before any boot writes a record of its own).
 */

/* rec_end is the length of the record in record sector s. */
static size_t rec_end(const nor *f, unsigned s)
{
	const uint8_t *m = f->mem[2 + s];

	return 11u + ((size_t)m[5] << 8 | m[6]);
}

/* rot_job boots a device and takes fw.begin and the first chunk (token 7,
 * seqs 1 and 2): three records written (the first boot's, then one a
 * step), the newest (tag 7/2) in sector 0, the older (7/1) in sector 1. */
static void rot_job(dev *d)
{
	dev_init(d, 5);
	CHECK(run_step(d, 0) == EFS_ACCEPTED && run_step(d, 1) == EFS_ACCEPTED && d->fw.cur == 0 &&
		d->f.mem[3][REC_SECTOR - 1] == 0x00 && d->f.mem[2][REC_SECTOR - 1] == 0xff,
		"rot job: %s, newest record in %d", d->r.reason, d->fw.cur);
}

/* rot_job_closed checks a device whose newest record rotted: every step
 * refused, none applied. */
static void rot_job_closed(dev *d, const char *what, size_t at, unsigned bit)
{
	CHECK(power_on(d, 1) == EFS_E_CORRUPT && d->fw.cur < 0, "%s (byte %zu bit %02x): open", what, at, bit);
	CHECK(run_step(d, 2) == EFS_INVALID && !d->r.apply && d->c.mark.seq == 2, "%s (byte %zu bit %02x): a step %d",
		what, at, bit, d->r.verdict);
}

/* rot_job_goes_on checks that the device boots at the newest record and
 * the job goes on to commit. */
static void rot_job_goes_on(dev *d, const char *what, size_t at, unsigned bit)
{
	int ok = power_on(d, 1) == EFS_OK && d->fw.job.seq == 2 && d->c.mark.seq == 2;

	for (int s = 2; ok && s < N_STEPS; s++) {
		ok = run_step(d, s) == EFS_ACCEPTED;
	}
	CHECK(ok && d->fw.job.state == EFS_FW_COMMITTED && d->f.violations == 0, "%s (byte %zu bit %02x): %s", what, at,
		bit, d->r.reason);
}

static void test_record_rot(void)
{
	static const uint8_t bits[] = { 0x01, 0x80 };
	dev d;
	size_t len, cases = 0;
	long mark, budget;

	rot_job(&d);
	len = rec_end(&d.f, 0);
	for (size_t at = 1; at < len; at += EFS_FW_TEAR_STRIDE) {
		for (size_t b = 0; b < sizeof bits; b++, cases++) {
			rot_job(&d);
			d.f.mem[2][at] ^= bits[b];
			rot_job_closed(&d, "newest record rotted", at, bits[b]);
			rot_job(&d);
			if (at < rec_end(&d.f, 1)) {
				d.f.mem[3][at] ^= bits[b];
			}
			rot_job_goes_on(&d, "older record rotted", at, bits[b]);
			rot_job(&d);
			d.f.mem[2][at] ^= bits[b];
			d.f.mem[3][at] ^= bits[b];
			rot_job_closed(&d, "both records rotted", at, bits[b]);
		}
	}
	/* A cut at the older record's superseded byte (the record's last
	 * byte programmed, before the step's mark): the open marks it. The
	 * reference run counts the chunk's bytes: slot data, record, its
	 * superseded byte, then the mark (slot, commit byte, superseded). */
	dev_init(&d, 5);
	run_step(&d, 0);
	d.f.programmed = 0;
	run_step(&d, 1);
	mark = (long)d.f.mem[d.c.cur][5] + 10; /* format 1: 6 + L + 4 */
	budget = d.f.programmed - (mark + 1) - 1;
	dev_init(&d, 5);
	run_step(&d, 0);
	d.f.programmed = 0;
	d.f.program_budget = budget;
	run_step(&d, 1);
	d.f.off = 0; /* the power back: open (efs_fw_boot would write a record of its own) */
	d.f.program_budget = -1;
	CHECK(!d.r.apply && efs_open(&d.c, &d.port) == EFS_OK && efs_fw_open(&d.fw, &d.fport, &d.c) == EFS_OK &&
		d.f.mem[3][REC_SECTOR - 1] == 0x00 && d.fw.cur == 0 && d.fw.job.seq == 2 && d.c.mark.seq == 2,
		"cut at the record's superseded byte: reopen, seq %llu, byte %02x", (unsigned long long)d.fw.job.seq,
		d.f.mem[3][REC_SECTOR - 1]);
	d.f.mem[2][40] ^= 0x08;
	rot_job_closed(&d, "cut at the record's superseded byte, then the newest rotted", 40, 0x08);
	printf("record rot: %zu bytes x %zu bits, newest, older and both (record %zu bytes)\n", cases / sizeof bits,
		sizeof bits, len);
}
