/*
 * The firmware job on the simulated flash (included by fw_host.c): a job
 * from begin to commit, the refusals with fwjob's reasons, the boot
 * loader's verdicts.
 */

static void test_sha256(void)
{
	static const uint8_t abc[32] = { 0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde, 0x5d,
		0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15,
		0xad };
	static const uint8_t two[32] = { 0x24, 0x8d, 0x6a, 0x61, 0xd2, 0x06, 0x38, 0xb8, 0xe5, 0xc0, 0x26, 0x93, 0x0c,
		0x3e, 0x60, 0x39, 0xa3, 0x3c, 0xe4, 0x59, 0x64, 0xff, 0x21, 0x67, 0xf6, 0xec, 0xed, 0xd4, 0x19, 0xdb, 0x06,
		0xc1 };
	static const uint8_t empty[32] = { 0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99,
		0x6f, 0xb9, 0x24, 0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8,
		0x55 };
	const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	uint8_t out[32];

	sum((const uint8_t *)"abc", 3, out);
	CHECK(memcmp(out, abc, 32) == 0, "sha256(abc)");
	sum((const uint8_t *)m2, strlen(m2), out);
	CHECK(memcmp(out, two, 32) == 0, "sha256 of two blocks");
	sum(NULL, 0, out);
	CHECK(memcmp(out, empty, 32) == 0, "sha256 of nothing");
}

static void make_image(void)
{
	for (int i = 0; i < IMAGE_SIZE; i++) {
		image[i] = (uint8_t)(i * 31 + (i >> 3));
	}
	sum(image, IMAGE_SIZE, image_sum);
	{
		uint8_t f[FACTORY_SIZE];

		for (int i = 0; i < FACTORY_SIZE; i++) {
			f[i] = (uint8_t)(i * 7 + 1);
		}
		sum(f, FACTORY_SIZE, factory_sum);
	}
}

/* step sends a step of job j1 at token/seq and checks the verdict. */
static int step(dev *d, const cmd *c, uint64_t token, uint64_t seq, efs_verdict want, const char *what)
{
	efs_verdict v = send(d, c, token, seq);

	CHECK(v == want, "%s: verdict %d, want %d (%s)", what, v, want, d->r.reason);
	return v == want;
}

/* download sends begin and every chunk of the image at token 7 from seq. */
static uint64_t download(dev *d, const char *job, uint64_t seq)
{
	cmd c;

	begin_body(&c, job, image_sum, IMAGE_SIZE, 3, CHUNK);
	step(d, &c, 7, seq++, EFS_ACCEPTED, "begin");
	for (uint64_t off = 0; off < IMAGE_SIZE; off += CHUNK) {
		size_t n = IMAGE_SIZE - off < CHUNK ? IMAGE_SIZE - off : CHUNK;
		chunk_body(&c, job, off, image + off, n);
		step(d, &c, 7, seq++, EFS_ACCEPTED, "chunk");
	}
	return seq;
}

static void test_job(void)
{
	dev d;
	cmd c;
	uint64_t seq;

	make_image();
	dev_init(&d, 0);
	CHECK(d.boot.slot == 0 && !d.boot.trial && memcmp(d.boot.image, factory_sum, 32) == 0 &&
		d.fw.boot.security == 2 && d.fw.boot.boots == 1, "first boot: slot %u", d.boot.slot);
	seq = download(&d, "j1", 1);
	CHECK(d.fw.job.state == EFS_FW_DOWNLOADED && d.fw.job.bytes == IMAGE_SIZE && d.fw.job.slot == 1,
		"after the last chunk: %s", efs_fw_state_name(d.fw.job.state));
	job_body(&c, "fw.install", "j1");
	step(&d, &c, 7, seq++, EFS_ACCEPTED, "install");
	CHECK(d.fw.job.state == EFS_FW_INSTALLED, "install settled: %s", efs_fw_state_name(d.fw.job.state));
	job_body(&c, "fw.activate", "j1");
	step(&d, &c, 7, seq++, EFS_ACCEPTED, "activate");
	CHECK(d.fw.job.state == EFS_FW_REBOOTING && efs_fw_reboot_pending(&d.fw) && d.fw.boot.tries == 3,
		"activate: %s", efs_fw_state_name(d.fw.job.state));
	CHECK(power_on(&d, 1) == EFS_OK && d.boot.slot == 1 && d.boot.trial &&
		memcmp(d.boot.image, image_sum, 32) == 0 && d.fw.job.state == EFS_FW_CONFIRMING && d.fw.boot.tries == 2,
		"trial boot: slot %u, %s", d.boot.slot, efs_fw_state_name(d.fw.job.state));
	job_body(&c, "fw.commit", "j1");
	step(&d, &c, 7, seq++, EFS_ACCEPTED, "commit");
	CHECK(d.fw.job.state == EFS_FW_COMMITTED && d.fw.boot.active == 1 && d.fw.boot.security == 3 &&
		d.fw.boot.trial == EFS_FW_NO_SLOT && !efs_fw_reboot_pending(&d.fw), "commit: %s",
		efs_fw_state_name(d.fw.job.state));
	CHECK(power_on(&d, 1) == EFS_OK && d.boot.slot == 1 && !d.boot.trial && d.fw.job.state == EFS_FW_COMMITTED &&
		d.c.mark.seq == seq - 1 && d.fw.job.seq == seq - 1, "after commit, reboot: slot %u", d.boot.slot);
	/* A redelivered step is a duplicate, a deposed holder's stale. */
	step(&d, &c, 7, seq - 1, EFS_DUPLICATE, "commit again");
	job_body(&c, "fw.cancel", "j1");
	step(&d, &c, 6, 99, EFS_STALE, "a deposed holder's cancel");
	CHECK(d.fw.job.state == EFS_FW_COMMITTED, "stale step applied");
	CHECK(d.f.violations == 0, "flash: %d violations", d.f.violations);
}

/* refused sends c and checks it is refused Invalid with class and reason,
 * the state and mark unchanged. */
static void refused(dev *d, const cmd *c, uint64_t seq, efs_fw_err class, const char *reason)
{
	efs_fw_job before = d->fw.job;
	efs_mark m = d->c.mark;

	send(d, c, 7, seq);
	CHECK(d->r.verdict == EFS_INVALID && !d->r.apply && d->fw.last == class &&
		strncmp(d->r.reason, reason, sizeof d->r.reason - 1) == 0,
		"%s: verdict %d class %d reason \"%s\", want class %d \"%s\"", c->kind, d->r.verdict, d->fw.last,
		d->r.reason, class, reason);
	CHECK(d->c.mark.token == m.token && d->c.mark.seq == m.seq && d->fw.job.state == before.state &&
		d->fw.job.bytes == before.bytes, "%s refused, but something moved", c->kind);
}

static void test_refusals(void)
{
	dev d;
	cmd c;
	uint8_t bad[32];

	dev_init(&d, 0);
	job_body(&c, "fw.install", "j1");
	refused(&d, &c, 1, EFS_FW_E_STATE,
		"apply: fwjob: illegal step: fw.install of job j1: no such job here (state idle, last job \"\")");
	begin_body(&c, "j1", image_sum, IMAGE_SIZE, 1, CHUNK);
	refused(&d, &c, 1, EFS_FW_E_ROLLBACK, "apply: fwjob: security version below the running one: fw.begin of job j1: "
		"image version 1 below the running security version 2");
	begin_body(&c, "j1", image_sum, IMAGE_SIZE, 2, CHUNK);
	step(&d, &c, 7, 1, EFS_ACCEPTED, "begin at the running version");
	job_body(&c, "fw.install", "j1");
	refused(&d, &c, 2, EFS_FW_E_STATE, "apply: fwjob: illegal step: fw.install of job j1 in state downloading");
	begin_body(&c, "j2", image_sum, IMAGE_SIZE, 3, CHUNK);
	refused(&d, &c, 2, EFS_FW_E_BUSY,
		"apply: fwjob: another job in progress: job j1 in progress (state downloading): fw.begin of job j2 refused");
	chunk_body(&c, "j1", 0, image, CHUNK);
	step(&d, &c, 7, 2, EFS_ACCEPTED, "chunk 0");
	refused(&d, &c, 3, EFS_FW_E_OFFSET, "apply: fwjob: chunk offset: job j1: expected offset 256, got 0");
	chunk_body(&c, "j1", 256, image + 256, CHUNK + 1);
	refused(&d, &c, 3, EFS_FW_E_COMMAND, "apply: fwjob: bad command: job j1: chunk of 257 bytes, the job's chunks are at most 256");
	job_body(&c, "fw.reboot", "j1");
	refused(&d, &c, 3, EFS_FW_E_COMMAND, "check: fwjob: bad command: unknown kind \"fw.reboot\" (want one of [\"fw.begin\" "
		"\"fw.chunk\" \"fw.install\" \"fw.activate\" \"fw.commit\" \"fw.cancel\"])");
	/* Bad hash at the last chunk: failed, with the reason. */
	memcpy(bad, image_sum, 32);
	bad[0] ^= 1;
	dev_init(&d, 0);
	begin_body(&c, "j1", bad, IMAGE_SIZE, 3, CHUNK);
	step(&d, &c, 7, 1, EFS_ACCEPTED, "begin");
	for (uint64_t off = 0, seq = 2; off < IMAGE_SIZE; off += CHUNK, seq++) {
		chunk_body(&c, "j1", off, image + off, IMAGE_SIZE - off < CHUNK ? IMAGE_SIZE - off : CHUNK);
		step(&d, &c, 7, seq, EFS_ACCEPTED, "chunk");
	}
	CHECK(d.fw.job.state == EFS_FW_FAILED && d.fw.job.reason_len > 0 &&
		memcmp(d.fw.job.reason, "received image SHA-256 ", 23) == 0, "bad hash: %s", efs_fw_state_name(d.fw.job.state));
	/* Cancel in each state. */
	for (int s = 0; s < 5; s++) {
		static const uint8_t want[] = { EFS_FW_FAILED, EFS_FW_FAILED, EFS_FW_FAILED, EFS_FW_ROLLED_BACK,
			EFS_FW_ROLLED_BACK };
		const char *steps[] = { "fw.install", "fw.activate" };
		uint64_t seq;

		dev_init(&d, 0);
		if (s == 0) {
			begin_body(&c, "j1", image_sum, IMAGE_SIZE, 3, CHUNK);
			step(&d, &c, 7, 1, EFS_ACCEPTED, "begin");
			seq = 2;
		} else {
			seq = download(&d, "j1", 1);
		}
		for (int k = 0; k < s - 1 && k < 2; k++) {
			job_body(&c, steps[k], "j1");
			step(&d, &c, 7, seq++, EFS_ACCEPTED, steps[k]);
		}
		if (s == 4) {
			CHECK(power_on(&d, 1) == EFS_OK && d.fw.job.state == EFS_FW_CONFIRMING, "cancel: confirming");
		}
		job_body(&c, "fw.cancel", "j1");
		step(&d, &c, 7, seq++, EFS_ACCEPTED, "cancel");
		CHECK(d.fw.job.state == want[s], "cancel %d: %s", s, efs_fw_state_name(d.fw.job.state));
		CHECK(s < 4 || efs_fw_reboot_pending(&d.fw), "cancel of the running trial: no reboot pending");
		CHECK(power_on(&d, 1) == EFS_OK && d.boot.slot == 0 && !d.boot.trial, "cancel %d: boots %u", s, d.boot.slot);
		refused(&d, &c, seq, EFS_FW_E_STATE, s < 3 ? "apply: fwjob: illegal step: fw.cancel of job j1 in state failed"
						       : "apply: fwjob: illegal step: fw.cancel of job j1 in state rolled_back");
	}
}

/* The signed device's port for test_tag_epoch: every signature of kid
 * "k" verifies (what is tested is not the crypto), the fleet epoch is
 * fleet_now, the application takes every kind but fw.*. */
static uint64_t fw_fleet_now;

static int any_key(void *user, const uint8_t *kid, size_t kid_len, const uint8_t *device, size_t device_len,
	const uint8_t digest[32], const uint8_t sig[64])
{
	(void)user;
	(void)device;
	(void)device_len;
	(void)digest;
	(void)sig;
	return kid_len == 1 && kid[0] == 'k' ? EFS_PORT_OK : EFS_PORT_UNKNOWN_KEY;
}

static uint64_t fw_fleet(void *user)
{
	(void)user;
	return fw_fleet_now;
}

static int app_ok(void *user, const efs_envelope *env, const char **reason)
{
	(void)user;
	(void)env;
	(void)reason;
	return 0;
}

/* test_tag_epoch: the job record's tag is not rolled forward over a mark
 * of a later epoch. A signed device's step at epoch 0 tags the record
 * 7/1; the fleet moves to epoch 1 (a trust update: no mark write) and the
 * application's command 2/1 of epoch 1 moves the mark alone. After a
 * reboot the mark is still 2/1 of epoch 1 (by token alone the tag 7/1 is
 * above it: rolled forward, the mark would fall back to epoch 0 and count
 * as none, and the application's command be applied twice). */
static void test_tag_epoch(void)
{
	dev d;
	cmd c;

	dev_init(&d, 0);
	d.port.sha256 = lib_sha256;
	d.port.verify = any_key;
	d.port.epoch = fw_fleet;
	d.fport.other = app_ok;
	d.signed_cmds = 1;
	fw_fleet_now = 0;
	begin_body(&c, "j1", image_sum, IMAGE_SIZE, 3, CHUNK);
	step(&d, &c, 7, 1, EFS_ACCEPTED, "a signed begin at epoch 0");
	fw_fleet_now = 1;
	d.epoch = 1;
	c.kind = "app.set";
	c.body_n = put_head(c.body, 5, 0);
	step(&d, &c, 2, 1, EFS_ACCEPTED, "the application's command of epoch 1");
	CHECK(d.fw.job.token == 7 && d.fw.job.epoch == 0 && power_on(&d, 1) == EFS_OK && d.c.epoch == 1 &&
		d.c.mark.token == 2 && d.c.mark.seq == 1, "after a reboot: mark e%llu %llu/%llu, the tag e%llu %llu/%llu",
		(unsigned long long)d.c.epoch, (unsigned long long)d.c.mark.token, (unsigned long long)d.c.mark.seq,
		(unsigned long long)d.fw.job.epoch, (unsigned long long)d.fw.job.token, (unsigned long long)d.fw.job.seq);
	step(&d, &c, 2, 1, EFS_DUPLICATE, "the application's command again");
	job_body(&c, "fw.cancel", "j1");
	step(&d, &c, 2, 2, EFS_ACCEPTED, "a step of epoch 1");
	CHECK(d.fw.job.epoch == 1 && power_on(&d, 1) == EFS_OK && d.c.epoch == 1 && d.c.mark.seq == 2 &&
		d.f.violations == 0, "a step of epoch 1: its tag's epoch");
	fw_fleet_now = 0;
}

/* activated returns a device whose job j1 is armed for a trial boot. */
static uint64_t activated(dev *d, uint8_t tries)
{
	cmd c;
	uint64_t seq;

	dev_init(d, tries);
	seq = download(d, "j1", 1);
	job_body(&c, "fw.install", "j1");
	step(d, &c, 7, seq++, EFS_ACCEPTED, "install");
	job_body(&c, "fw.activate", "j1");
	step(d, &c, 7, seq++, EFS_ACCEPTED, "activate");
	return seq;
}

static void test_boots(void)
{
	dev d;

	/* Unhealthy: rolled back, the old slot runs, nothing older begins. */
	activated(&d, 0);
	CHECK(power_on(&d, 0) == EFS_OK && d.fw.job.state == EFS_FW_ROLLED_BACK && d.fw.boot.running == 0 &&
		efs_fw_reboot_pending(&d.fw) == 0 && strncmp(d.fw.job.reason, "health check failed: app did not come up",
		d.fw.job.reason_len) == 0, "unhealthy: %s", efs_fw_state_name(d.fw.job.state));
	CHECK(power_on(&d, 1) == EFS_OK && d.boot.slot == 0 && !d.boot.trial, "after roll back: slot %u", d.boot.slot);
	/* No verdict ever (the new image hangs): tries spent, rolled back. */
	activated(&d, 2);
	for (int i = 0; i < 2; i++) {
		d.f.off = 0;
		CHECK(efs_open(&d.c, &d.port) == EFS_OK && efs_fw_open(&d.fw, &d.fport, &d.c) == EFS_OK &&
			efs_fw_boot(&d.fw, &d.boot) == EFS_OK && d.boot.trial && d.boot.slot == 1, "trial %d", i);
	}
	CHECK(power_on(&d, 1) == EFS_OK && !d.boot.trial && d.boot.slot == 0 && d.fw.job.state == EFS_FW_ROLLED_BACK &&
		strncmp(d.fw.job.reason, "trial boots exhausted", 21) == 0, "tries spent: %s", efs_fw_state_name(d.fw.job.state));
	/* The trial slot damaged after activate: never booted. */
	activated(&d, 0);
	d.f.mem[5][100] ^= 0x10;
	CHECK(power_on(&d, 1) == EFS_OK && !d.boot.trial && d.boot.slot == 0 && d.fw.job.state == EFS_FW_ROLLED_BACK &&
		strncmp(d.fw.job.reason, "trial boot refused: slot b (1000 bytes) SHA-256 ", 48) == 0,
		"damaged trial: %s %.*s", efs_fw_state_name(d.fw.job.state), d.fw.job.reason_len, d.fw.job.reason);
	/* A damaged job record with no valid one: fail closed. */
	dev_init(&d, 0);
	d.f.mem[2][20] ^= 1;
	d.f.mem[3][20] ^= 1;
	d.f.off = 0;
	CHECK(efs_open(&d.c, &d.port) == EFS_OK && efs_fw_open(&d.fw, &d.fport, &d.c) == EFS_E_CORRUPT &&
		efs_fw_boot(&d.fw, &d.boot) != EFS_OK, "damaged record opened");
}
