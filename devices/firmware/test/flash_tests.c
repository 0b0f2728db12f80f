/*
 * Flash tests (included by host.c): durable before effect, and a power cut
 * at any byte of a mark's write, or in its erase, never loses the last
 * complete mark.
 */

/* envelope_at writes a valid envelope for dev to p, of epoch (key 10
 * left out for 0). */
static size_t envelope_at(uint8_t *p, const char *dev, uint64_t epoch, uint64_t token, uint64_t seq, const char *holder)
{
	size_t n = put_head(p, 5, epoch != 0 ? 8 : 7);

	n += put_head(p + n, 0, 1);
	n += put_head(p + n, 0, 1);
	n += put_head(p + n, 0, 2);
	n += put_text(p + n, dev);
	n += put_head(p + n, 0, 3);
	n += put_head(p + n, 0, token);
	n += put_head(p + n, 0, 4);
	n += put_head(p + n, 0, seq);
	n += put_head(p + n, 0, 5);
	n += put_text(p + n, "cmd-1");
	n += put_head(p + n, 0, 6);
	n += put_text(p + n, "set");
	n += put_head(p + n, 0, 9);
	n += put_text(p + n, holder);
	if (epoch != 0) {
		n += put_head(p + n, 0, 10);
		n += put_head(p + n, 0, epoch);
	}
	return n;
}

/* send_at processes a command of epoch, token and seq to dev. */
static efs_verdict send_at(efs_ctx *c, const char *dev, uint64_t epoch, uint64_t token, uint64_t seq, efs_result *r)
{
	uint8_t buf[512];
	size_t n = envelope_at(buf, dev, epoch, token, seq, "gateway-b-with-a-long-holder-name");

	efs_process(c, (const uint8_t *)dev, strlen(dev), buf, n, r);
	return r->verdict;
}

static efs_verdict send(efs_ctx *c, uint64_t token, uint64_t seq, efs_result *r)
{
	return send_at(c, "dev", 0, token, seq, r);
}

/* A device on a simulated flash. */
typedef struct {
	flash f;
	efs_port port;
	efs_ctx c;
	efs_result r;
} rig;

/* rig_start powers up a rig on fresh flash and accepts marks 5/1 to 5/n. */
static void rig_start(rig *d, uint64_t n)
{
	flash_init(&d->f, &d->port);
	efs_open(&d->c, &d->port);
	for (uint64_t s = 1; s <= n; s++) {
		send(&d->c, 5, s, &d->r);
	}
}

/* tear_write cuts the power at byte k of the write of mark 6/1 over the
 * marks 5/1 and 5/2 (both sectors in use), or at the first write when
 * fresh, and checks what a reboot finds. Returns 1 if the write finished
 * before the cut. */
static int tear_write(long k, uint8_t torn_bits, int fresh)
{
	rig d;
	efs_mark old = { 0, 0 }, *m = &d.c.mark;
	int applied;

	rig_start(&d, fresh ? 0 : 2);
	if (!fresh) {
		old.token = 5;
		old.seq = 2;
	}
	d.f.programmed = 0;
	d.f.program_budget = k;
	d.f.torn_bits = torn_bits;
	send(&d.c, 6, 1, &d.r);
	applied = d.r.apply;
	CHECK(applied == (d.r.verdict == EFS_ACCEPTED) && (applied || d.r.err == EFS_E_STORAGE),
		"tear at %ld: verdict %d apply %d (%s)", k, d.r.verdict, d.r.apply, d.r.reason);
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK, "tear at %ld (bits %02x, fresh %d): reopen refused", k,
		torn_bits, fresh);
	if (applied) { /* durable before effect */
		CHECK(m->token == 6 && m->seq == 1, "tear at %ld: applied but mark %llu/%llu", k,
			(unsigned long long)m->token, (unsigned long long)m->seq);
	} else { /* the last complete mark, or the new one: never anything else */
		CHECK((m->token == old.token && m->seq == old.seq) || (m->token == 6 && m->seq == 1),
			"tear at %ld (bits %02x, fresh %d): mark %llu/%llu after reboot", k, torn_bits, fresh,
			(unsigned long long)m->token, (unsigned long long)m->seq);
	}
	/* The device goes on: the next command is accepted and kept, an
	 * older token is stale. */
	send(&d.c, 6, 2, &d.r);
	CHECK(d.r.verdict == EFS_ACCEPTED && d.r.apply, "tear at %ld: next command %d (%s)", k, d.r.verdict,
		d.r.reason);
	send(&d.c, 4, 9, &d.r);
	CHECK(d.r.verdict == EFS_STALE, "tear at %ld: older token %d", k, d.r.verdict);
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK && m->token == 6 && m->seq == 2,
		"tear at %ld: mark after the next command lost", k);
	CHECK(d.f.violations == 0, "tear at %ld: a byte programmed twice without an erase", k);
	return applied;
}

static void test_tears(void)
{
	static const uint8_t bits[] = { 0xff, 0x0f, 0xf0, 0x00 };
	long k;

	for (int fresh = 0; fresh < 2; fresh++) {
		for (size_t b = 0; b < sizeof bits; b++) {
			for (k = 0; k < 1000 && !tear_write(k, bits[b], fresh); k++) {
			}
			CHECK(k > 40 && k < 1000, "tears: write finished after %ld bytes", k);
		}
	}
}

static void test_torn_erase(void)
{
	for (long e = 0; e <= SECTOR; e += 7) {
		rig d;

		rig_start(&d, 2);
		d.f.erase_budget = e;
		send(&d.c, 6, 1, &d.r);
		CHECK(d.r.verdict == (e < SECTOR ? EFS_INVALID : EFS_ACCEPTED), "erase cut at %ld: verdict %d", e,
			d.r.verdict);
		CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK, "erase cut at %ld: reopen", e);
		CHECK(d.c.mark.token == (e < SECTOR ? 5u : 6u), "erase cut at %ld: mark %llu/%llu", e,
			(unsigned long long)d.c.mark.token, (unsigned long long)d.c.mark.seq);
	}
}

static void test_alternation(void)
{
	flash f;
	efs_port port;
	efs_ctx c;
	efs_result r;
	efs_mark_record rec;

	flash_init(&f, &port);
	CHECK(efs_open(&c, &port) == EFS_OK && c.mark.token == 0, "fresh flash");
	for (uint64_t s = 1; s <= 50; s++) {
		CHECK(send(&c, 7, s, &r) == EFS_ACCEPTED && r.apply, "seq %llu", (unsigned long long)s);
		CHECK(send(&c, 7, s, &r) == EFS_DUPLICATE && !r.apply, "seq %llu again", (unsigned long long)s);
		CHECK(power_on(&f, &c, &port) == EFS_OK && c.mark.seq == s && c.gen == s,
			"seq %llu after reboot: %llu (generation %u)", (unsigned long long)s,
			(unsigned long long)c.mark.seq, (unsigned)c.gen);
		CHECK(efs_read_mark_record(&c, &rec) == EFS_OK && rec.mark.seq == s && rec.holder_len == 33 &&
			memcmp(rec.holder, "gateway-b-with-a-long-holder-name", 33) == 0 && rec.id_len == 5,
			"holder and id kept");
	}
	CHECK(f.violations == 0, "a byte programmed twice");
}

static void test_damage(void)
{
	rig d;

	/* The only record damaged: fail closed, every command refused. */
	rig_start(&d, 1);
	d.f.mem[0][20] ^= 0x01;
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_E_CORRUPT, "damaged only record: open");
	CHECK(send(&d.c, 9, 1, &d.r) == EFS_INVALID && d.r.err == EFS_E_CORRUPT && d.r.mark.token == 0 && !d.r.apply,
		"damaged only record: command %d", d.r.verdict);
	/* Both damaged. */
	rig_start(&d, 2);
	d.f.mem[0][8] ^= 0x40;
	d.f.mem[1][30] ^= 0x02;
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_E_CORRUPT, "both damaged: open");
	/* A failing flash: the command is refused, never applied. */
	rig_start(&d, 0);
	d.f.off = 1;
	CHECK(send(&d.c, 5, 1, &d.r) == EFS_INVALID && d.r.err == EFS_E_STORAGE && !d.r.apply && d.r.mark.token == 0,
		"flash off: verdict %d", d.r.verdict);
}

/* slot_end is the length of the slot in sector s (format 1, 2 or 3). */
static size_t slot_end(const flash *f, unsigned s)
{
	const uint8_t *m = f->mem[s];

	return m[5] == 1 ? 7u + m[6] + 16u + 4u : m[5] == 0 ? 7u + m[6] + 8u + 4u : 6u + m[5] + 4u;
}

/* rot_rig writes 5/1 (and 5/2 if newest is 0), then 6/1: the newest slot
 * in sector newest, the older one (token 5) in the other. */
static void rot_rig(rig *d, unsigned newest)
{
	rig_start(d, newest == 0 ? 2 : 1);
	send(&d->c, 6, 1, &d->r);
	CHECK(d->r.apply && d->c.cur == (int8_t)newest && d->f.mem[!newest][SECTOR - 1] == 0x00 &&
		d->f.mem[newest][SECTOR - 1] == 0xff, "rot rig: newest in %d, superseded bytes %02x %02x", d->c.cur,
		d->f.mem[0][SECTOR - 1], d->f.mem[1][SECTOR - 1]);
}

/* rot_closed checks a device whose newest slot rotted: it opens refusing
 * every command, the deposed holder's next one (token 5) first. */
static void rot_closed(rig *d, const char *what, unsigned at, unsigned bit)
{
	CHECK(power_on(&d->f, &d->c, &d->port) == EFS_E_CORRUPT, "%s (byte %u bit %02x): open %d, mark %llu/%llu", what,
		at, bit, d->c.corrupt, (unsigned long long)d->c.mark.token, (unsigned long long)d->c.mark.seq);
	CHECK(send(&d->c, 5, 3, &d->r) == EFS_INVALID && d->r.err == EFS_E_CORRUPT && !d->r.apply,
		"%s (byte %u bit %02x): the deposed holder's command %d", what, at, bit, d->r.verdict);
	CHECK(send(&d->c, 7, 1, &d->r) == EFS_INVALID && !d->r.apply, "%s: a newer command %d", what, d->r.verdict);
}

/* test_rot: bits flipped after complete writes (rot, not a cut), every
 * bit of every byte of a slot but its commit byte, the newest slot in
 * either sector. The newest damaged: fail closed (its older neighbour is
 * below the mark a command was applied at, and would take the deposed
 * holder's next command); the older one: the newest is used; both: fail
 * closed. */
static void test_rot(void)
{
	for (unsigned newest = 0; newest < 2; newest++) {
		rig d;
		size_t len;

		rot_rig(&d, newest);
		len = slot_end(&d.f, newest);
		for (unsigned at = 1; at < len; at++) {
			for (unsigned bit = 1; bit < 0x100; bit <<= 1) {
				rot_rig(&d, newest);
				d.f.mem[newest][at] ^= (uint8_t)bit;
				rot_closed(&d, "newest rotted", at, bit);
				rot_rig(&d, newest);
				d.f.mem[!newest][at] ^= (uint8_t)bit;
				CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK && d.c.mark.token == 6 && d.c.mark.seq == 1,
					"older rotted (byte %u bit %02x): mark %llu/%llu", at, bit,
					(unsigned long long)d.c.mark.token, (unsigned long long)d.c.mark.seq);
				CHECK(send(&d.c, 5, 3, &d.r) == EFS_STALE && send(&d.c, 6, 2, &d.r) == EFS_ACCEPTED &&
					power_on(&d.f, &d.c, &d.port) == EFS_OK && d.c.mark.seq == 2 && d.f.violations == 0,
					"older rotted (byte %u bit %02x): the device goes on", at, bit);
				rot_rig(&d, newest);
				d.f.mem[0][at] ^= (uint8_t)bit;
				d.f.mem[1][at] ^= (uint8_t)bit;
				rot_closed(&d, "both rotted", at, bit);
			}
		}
		/* The newest slot's superseded byte rotted: still the newest. */
		rot_rig(&d, newest);
		d.f.mem[newest][SECTOR - 1] = 0xef;
		CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK && d.c.mark.token == 6 && d.c.cur == (int8_t)newest,
			"the newest's superseded byte rotted");
	}
}

/* test_supersede_at_open: a slot left unmarked (a cut at its superseded
 * byte, or the flash of a library before it) is marked at the next open;
 * from then on a rotted newest fails closed. */
static void test_supersede_at_open(void)
{
	static const uint8_t bits[] = { 0xff, 0x0f, 0x00 };
	rig d;

	for (size_t b = 0; b < sizeof bits; b++) {
		rig_start(&d, 1); /* 5/1 in sector 0 */
		d.f.programmed = 0;
		d.f.program_budget = (long)slot_end(&d.f, 0); /* bytes 1.., the commit byte: then the superseded byte */
		d.f.torn_bits = bits[b];
		send(&d.c, 6, 1, &d.r);
		CHECK(!d.r.apply && d.r.err == EFS_E_STORAGE && d.f.mem[1][0] != 0xff, "cut at the superseded byte: %d",
			d.r.verdict);
		CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK && d.c.mark.token == 6 && d.f.mem[0][SECTOR - 1] != 0xff &&
			d.f.violations == 0, "cut at the superseded byte (%02x): reopen, mark %llu, byte %02x", bits[b],
			(unsigned long long)d.c.mark.token, d.f.mem[0][SECTOR - 1]);
		d.f.mem[1][20] ^= 0x04;
		rot_closed(&d, "cut at the superseded byte, then the newest rotted", 20, 0x04);
	}
	/* An older library's flash: no superseded byte set. Opened while
	 * both are valid, the older one is marked. */
	rot_rig(&d, 1);
	d.f.mem[0][SECTOR - 1] = 0xff;
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK && d.f.mem[0][SECTOR - 1] == 0x00 && d.c.mark.token == 6,
		"an older library's flash: the older slot marked at open");
	d.f.mem[1][30] ^= 0x10;
	rot_closed(&d, "an older library's flash, marked, then the newest rotted", 30, 0x10);
	/* Its newest already damaged at that first open: nothing tells the
	 * older slot from the newest (the old rule: the valid one is used). */
	rot_rig(&d, 1);
	d.f.mem[0][SECTOR - 1] = 0xff;
	d.f.mem[1][30] ^= 0x10;
	CHECK(power_on(&d.f, &d.c, &d.port) == EFS_OK && d.c.mark.token == 5, "an older library's flash, rotted");
	/* Marking fails at open (the flash refuses the program): refused. */
	rot_rig(&d, 1);
	d.f.mem[0][SECTOR - 1] = 0xff;
	d.f.programmed = 0;
	d.f.program_budget = 0;
	CHECK(efs_open(&d.c, &d.port) == EFS_E_STORAGE && send(&d.c, 6, 2, &d.r) == EFS_INVALID && !d.r.apply,
		"marking fails at open: %d", d.r.verdict);
}

static void test_flash(void)
{
	test_tears();
	test_torn_erase();
	test_alternation();
	test_damage();
	test_rot();
	test_supersede_at_open();
}
