/*
 * The firmware job's host runner: the conformance vectors from the Go
 * devices/fwjob (testdata/fw_vectors.h) against efs_fw, a job on a
 * simulated NOR flash from begin to commit and its refusals, and power
 * cuts at every byte programmed (and through the erases) of every step of
 * a job: after each cut the device boots a verified image, the mark and
 * the job record agree, and the job goes on to commit. Built and run by
 * fwjob_test.go under AddressSanitizer and UBSan. Prints each failure and
 * exits 1 if there was one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "efshim_fw.h"

#include "check.h"

/* The device's flash: regions 0-1 the mark sectors, 2-3 the job record's,
 * 4-5 the image slots A and B. NOR: erase to 0xFF, program ANDs. The power
 * is cut after program_budget bytes (the torn byte gets value | torn_bits)
 * or erase_budget bytes erased, counted over every region. */
#define MARK_SECTOR 512
#define REC_SECTOR 1024
#define SLOT 2048
typedef struct {
	uint8_t mem[6][SLOT];
	long program_budget, erase_budget;
	uint8_t torn_bits;
	int off;
	long programmed, erased;
	int violations; /* a mark or record byte programmed twice, or a slot byte programmed to another value */
} nor;

static const uint32_t region_size[6] = { MARK_SECTOR, MARK_SECTOR, REC_SECTOR, REC_SECTOR, SLOT, SLOT };

static int n_read(nor *f, unsigned r, uint32_t off, uint8_t *b, size_t n)
{
	if (f->off || off + n > region_size[r]) {
		return -1;
	}
	memcpy(b, f->mem[r] + off, n);
	return 0;
}

static int n_erase(nor *f, unsigned r)
{
	if (f->off) {
		return -1;
	}
	for (uint32_t i = 0; i < region_size[r]; i++) {
		if (f->erase_budget >= 0 && f->erased == f->erase_budget) {
			f->off = 1;
			return -1;
		}
		f->mem[r][i] = 0xff;
		f->erased++;
	}
	return 0;
}

static int n_program(nor *f, unsigned r, uint32_t off, const uint8_t *b, size_t n)
{
	if (f->off || off + n > region_size[r]) {
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		uint8_t *m = &f->mem[r][off + i];

		if (r < 4 ? *m != 0xff : (*m & b[i]) != b[i]) {
			f->violations++;
		}
		if (f->program_budget >= 0 && f->programmed == f->program_budget) {
			*m &= (uint8_t)(b[i] | f->torn_bits);
			f->off = 1;
			return -1;
		}
		*m &= b[i];
		f->programmed++;
	}
	return 0;
}

static int m_read(void *u, unsigned s, uint32_t off, uint8_t *b, size_t n) { return s > 1 ? -1 : n_read(u, s, off, b, n); }
static int m_erase(void *u, unsigned s) { return s > 1 ? -1 : n_erase(u, s); }
static int m_program(void *u, unsigned s, uint32_t off, const uint8_t *b, size_t n) { return s > 1 ? -1 : n_program(u, s, off, b, n); }
static int r_read(void *u, unsigned s, uint32_t off, uint8_t *b, size_t n) { return s > 1 ? -1 : n_read(u, 2 + s, off, b, n); }
static int r_erase(void *u, unsigned s) { return s > 1 ? -1 : n_erase(u, 2 + s); }
static int r_program(void *u, unsigned s, uint32_t off, const uint8_t *b, size_t n) { return s > 1 ? -1 : n_program(u, 2 + s, off, b, n); }
static int s_read(void *u, unsigned s, uint32_t off, uint8_t *b, size_t n) { return s > 1 ? -1 : n_read(u, 4 + s, off, b, n); }
static int s_erase(void *u, unsigned s) { return s > 1 ? -1 : n_erase(u, 4 + s); }
static int s_program(void *u, unsigned s, uint32_t off, const uint8_t *b, size_t n) { return s > 1 ? -1 : n_program(u, 4 + s, off, b, n); }

/* A device: its flash, ports, fence point and firmware state. */
typedef struct {
	nor f;
	efs_port port;
	efs_fw_port fport;
	efs_ctx c;
	efs_fw fw;
	efs_result r;
	efs_fw_boot_info boot;
	uint64_t epoch; /* the epoch send stamps on commands (0: key 10 left out) */
	int signed_cmds; /* send signs them (kid "k", a zero signature: the port's verify takes it) */
} dev;

#define FACTORY_SIZE 300
#define IMAGE_SIZE 1000
#define CHUNK 256

static uint8_t image[IMAGE_SIZE], image_sum[32], factory_sum[32];

/* The factory image in slot A at the first boot. */
static const uint8_t *factory = NULL;
static size_t factory_n = FACTORY_SIZE;
static uint64_t factory_security = 2;

static void sum(const uint8_t *p, size_t n, uint8_t out[32])
{
	efs_sha256_ctx h;

	efs_sha256_init(&h);
	efs_sha256_update(&h, p, n);
	efs_sha256_final(&h, out);
}

/* power_on restores the power and boots: open the fence point and the
 * job record, the boot loader's decision, and a trial boot's health
 * verdict (healthy). */
static efs_err power_on(dev *d, int healthy)
{
	efs_err e;

	d->f.off = 0;
	d->f.program_budget = -1;
	d->f.erase_budget = -1;
	if ((e = efs_open(&d->c, &d->port)) != EFS_OK || (e = efs_fw_open(&d->fw, &d->fport, &d->c)) != EFS_OK ||
		(e = efs_fw_boot(&d->fw, &d->boot)) != EFS_OK) {
		return e;
	}
	return d->boot.trial ? efs_fw_health(&d->fw, healthy, healthy ? NULL : "app did not come up") : EFS_OK;
}

static void dev_init(dev *d, uint8_t tries)
{
	memset(d, 0, sizeof *d);
	memset(d->f.mem, 0xff, sizeof d->f.mem);
	for (size_t i = 0; i < factory_n; i++) {
		d->f.mem[4][i] = factory != NULL ? factory[i] : (uint8_t)(i * 7 + 1);
	}
	d->f.torn_bits = 0xff;
	d->port.user = &d->f;
	d->port.sector_size = MARK_SECTOR;
	d->port.flash_read = m_read;
	d->port.flash_erase = m_erase;
	d->port.flash_program = m_program;
	d->fport.user = &d->f;
	d->fport.slot_size = SLOT;
	d->fport.record_sector_size = REC_SECTOR;
	d->fport.slot_read = s_read;
	d->fport.slot_erase = s_erase;
	d->fport.slot_program = s_program;
	d->fport.record_read = r_read;
	d->fport.record_erase = r_erase;
	d->fport.record_program = r_program;
	d->fport.boot_tries = tries;
	d->fport.factory_security = factory_security;
	d->fport.factory_size = (uint32_t)factory_n;
	CHECK(power_on(d, 1) == EFS_OK, "first boot");
}

/* A command: kind and body under token/seq from holder. */
typedef struct {
	uint8_t body[1200];
	size_t body_n;
	const char *kind;
} cmd;

static void job_body(cmd *c, const char *kind, const char *job)
{
	c->kind = kind;
	c->body_n = put_head(c->body, 5, 1);
	c->body_n += put_text(c->body + c->body_n, "job");
	c->body_n += put_text(c->body + c->body_n, job);
}

static void begin_body(cmd *c, const char *job, const uint8_t img[32], uint64_t size, uint64_t version, uint64_t chunk)
{
	size_t n = put_head(c->body, 5, 5);

	c->kind = "fw.begin";
	n += put_text(c->body + n, "job");
	n += put_text(c->body + n, job);
	n += put_text(c->body + n, "image");
	n += put_str(c->body + n, 2, img, 32);
	n += put_text(c->body + n, "size");
	n += put_head(c->body + n, 0, size);
	n += put_text(c->body + n, "version");
	n += put_head(c->body + n, 0, version);
	n += put_text(c->body + n, "chunk");
	n += put_head(c->body + n, 0, chunk);
	c->body_n = n;
}

static void chunk_body(cmd *c, const char *job, uint64_t off, const uint8_t *data, size_t n)
{
	size_t k = put_head(c->body, 5, 3);

	c->kind = "fw.chunk";
	k += put_text(c->body + k, "job");
	k += put_text(c->body + k, job);
	k += put_text(c->body + k, "off");
	k += put_head(c->body + k, 0, off);
	k += put_text(c->body + k, "data");
	k += put_str(c->body + k, 2, data, n);
	c->body_n = k;
}

static efs_verdict send(dev *d, const cmd *c, uint64_t token, uint64_t seq)
{
	uint8_t buf[1400];
	size_t n = put_head(buf, 5, d->epoch != 0 ? 9 : 8);

	n += put_head(buf + n, 0, 1);
	n += put_head(buf + n, 0, 1);
	n += put_head(buf + n, 0, 2);
	n += put_text(buf + n, "dev");
	n += put_head(buf + n, 0, 3);
	n += put_head(buf + n, 0, token);
	n += put_head(buf + n, 0, 4);
	n += put_head(buf + n, 0, seq);
	n += put_head(buf + n, 0, 5);
	n += put_text(buf + n, "cmd-1");
	n += put_head(buf + n, 0, 6);
	n += put_text(buf + n, c->kind);
	n += put_head(buf + n, 0, 7);
	memcpy(buf + n, c->body, c->body_n);
	n += c->body_n;
	n += put_head(buf + n, 0, 9);
	n += put_text(buf + n, token == 7 ? "gateway-a" : "gateway-b");
	if (d->epoch != 0) {
		n += put_head(buf + n, 0, 10);
		n += put_head(buf + n, 0, d->epoch);
	}
	if (d->signed_cmds) { /* COSE_Sign1: protected {1: -7, 4: "k"}, {}, the envelope, the signature */
		static const uint8_t prot[] = { 0x46, 0xa2, 0x01, 0x26, 0x04, 0x41, 'k' }, sig[66] = { 0x58, 64 };
		uint8_t env[sizeof buf];

		memcpy(env, buf, n);
		buf[0] = 0xd2;
		buf[1] = 0x84;
		memcpy(buf + 2, prot, sizeof prot);
		buf[2 + sizeof prot] = 0xa0;
		n = 3 + sizeof prot + put_str(buf + 3 + sizeof prot, 2, env, n);
		memcpy(buf + n, sig, sizeof sig);
		n += sizeof sig;
	}
	efs_fw_process(&d->fw, (const uint8_t *)"dev", 3, buf, n, &d->r);
	return d->r.verdict;
}

/* lib_sha256 is the fence port's SHA-256 (a reset's Sig_structure) on the
 * library's own. */
static int lib_sha256(void *user, const struct efs_bytes *parts, size_t n, uint8_t digest[32])
{
	efs_sha256_ctx h;

	(void)user;
	efs_sha256_init(&h);
	for (size_t i = 0; i < n; i++) {
		efs_sha256_update(&h, parts[i].p, parts[i].n);
	}
	efs_sha256_final(&h, digest);
	return 0;
}

#include "fw_script.c"
#include "fw_tears.c"
#include "fw_rot.c"
#include "fw_vectors.c"

int main(void)
{
	test_sha256();
	test_job();
	test_refusals();
	test_boots();
	test_tag_epoch();
	test_tears();
	test_reset_tears();
	test_record_rot();
	test_vectors();
	printf("%d checks, %d failures\n", checks, failures);
	return failures ? 1 : 0;
}
