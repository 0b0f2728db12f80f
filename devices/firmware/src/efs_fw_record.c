/*
 * The firmware job's record on flash: two alternating slots, one per record
 * sector, like the marks (efs_mark.c):
 *
 *	offset  size  field
 *	0       1     commit byte, programmed last
 *	1       4     generation, big-endian, from 1
 *	5       2     payload length L
 *	7       L     payload (below)
 *	7+L     4     CRC-32C of bytes 1 to 7+L
 *
 * Payload, big-endian numbers: the version (1; 2 once an operator's reset
 * was applied; 3 once a step's mark is of an epoch); the holder (length
 * byte, bytes) and command id (length byte, bytes) of the step that wrote
 * it, for the mark's roll forward; version 2: the fence's reset counter
 * (u64, not 0) when that step's mark was stored (efs_fw_open rolls the mark
 * forward only within the same counter: a reset since leaves the tag
 * behind); version 3: that counter (u64, 0 if none) and the mark's epoch
 * (u64, not 0; the roll forward compares it first and writes the mark in
 * it); the job: id (length byte, bytes), state, slot,
 * image[32], size, chunk, version, bytes, token, seq (u64 each), reason
 * (length byte, bytes); the boot state: active, running, trial, tries,
 * active_image[32], trial_image[32], active_size, trial_size, security,
 * boots (u64 each).
 *
 * The sector's last byte is the record's superseded byte, as the marks'
 * (efs_mark.c): erased with the sector, programmed to 0 once a newer record
 * is complete in the other sector.
 *
 * A new record goes to the sector not holding the newest valid one: erase,
 * program bytes 1.., read them back, program the commit byte, then mark the
 * older record superseded. A cut at any byte leaves the newest complete
 * record valid. One valid record and one damaged: the valid one is used if
 * it is not superseded (the damaged one is the older, rotted, or its erase
 * was cut), else the newest rotted and the load fails closed.
 */
#include <string.h>

#include "efs_fw_internal.h"

#define COMMIT 0xa5

typedef struct {
	uint8_t *p;
	size_t n, cap;
	int bad;
} wbuf;

static void put(wbuf *w, const void *b, size_t n)
{
	if (w->cap - w->n < n) {
		w->bad = 1;
		return;
	}
	if (n > 0) {
		memcpy(w->p + w->n, b, n);
	}
	w->n += n;
}

static void put_u(wbuf *w, uint64_t v, int n)
{
	uint8_t b[8];

	for (int k = 0; k < n; k++) {
		b[k] = (uint8_t)(v >> (8 * (n - 1 - k)));
	}
	put(w, b, (size_t)n);
}

static void put_str(wbuf *w, const void *p, size_t n)
{
	put_u(w, n, 1);
	put(w, p, n);
}

typedef struct {
	const uint8_t *p;
	size_t n, i;
	int bad;
} rbuf;

static const uint8_t *get(rbuf *r, size_t n)
{
	const uint8_t *p = r->p + r->i;

	if (r->bad || r->n - r->i < n) {
		r->bad = 1;
		return NULL;
	}
	r->i += n;
	return p;
}

static uint64_t get_u(rbuf *r, int n)
{
	const uint8_t *p = get(r, (size_t)n);
	uint64_t v = 0;

	for (int k = 0; p != NULL && k < n; k++) {
		v = v << 8 | p[k];
	}
	return v;
}

static void get_into(rbuf *r, void *dst, size_t n)
{
	const uint8_t *p = get(r, n);

	if (p != NULL && n > 0) {
		memcpy(dst, p, n);
	}
}

/* get_str reads a length byte of at most max and the bytes into dst. */
static uint8_t get_str(rbuf *r, void *dst, size_t max)
{
	uint8_t n = (uint8_t)get_u(r, 1);

	if (n > max) {
		r->bad = 1;
		return 0;
	}
	get_into(r, dst, n);
	return n;
}

static void encode(wbuf *w, const efs_fw_job *j, const efs_fw_boot_state *b, efs_bytes holder, efs_bytes id)
{
	/* version 1 while there was no reset nor epoch: the same bytes as before */
	put_u(w, j->epoch != 0 ? 3 : j->counter != 0 ? 2 : 1, 1);
	put_str(w, holder.p, holder.n);
	put_str(w, id.p, id.n);
	if (j->counter != 0 || j->epoch != 0) {
		put_u(w, j->counter, 8);
	}
	if (j->epoch != 0) {
		put_u(w, j->epoch, 8);
	}
	put_str(w, j->id, j->id_len);
	put_u(w, j->state, 1);
	put_u(w, j->slot, 1);
	put(w, j->image, 32);
	put_u(w, j->size, 8);
	put_u(w, j->chunk, 8);
	put_u(w, j->version, 8);
	put_u(w, j->bytes, 8);
	put_u(w, j->token, 8);
	put_u(w, j->seq, 8);
	put_str(w, j->reason, j->reason_len);
	put_u(w, b->active, 1);
	put_u(w, b->running, 1);
	put_u(w, b->trial, 1);
	put_u(w, b->tries, 1);
	put(w, b->active_image, 32);
	put(w, b->trial_image, 32);
	put_u(w, b->active_size, 8);
	put_u(w, b->trial_size, 8);
	put_u(w, b->security, 8);
	put_u(w, b->boots, 8);
}

/* valid checks what a reader relies on (fwjob's record.valid). */
static int valid(const efs_fw_job *j, const efs_fw_boot_state *b)
{
	return j->state <= EFS_FW_ROLLED_BACK && b->active <= 1 && b->running <= 1 &&
		(b->trial == EFS_FW_NO_SLOT || (b->trial <= 1 && b->trial != b->active)) &&
		(j->state == EFS_FW_IDLE || (j->slot <= 1 && j->bytes <= j->size));
}

static int decode(rbuf *r, efs_fw_job *j, efs_fw_boot_state *b, efs_mark_record *tag)
{
	uint64_t version;

	memset(j, 0, sizeof *j);
	memset(b, 0, sizeof *b);
	memset(tag, 0, sizeof *tag);
	if ((version = get_u(r, 1)) < 1 || version > 3) {
		return 0;
	}
	tag->holder_len = get_str(r, tag->holder, EFS_MAX_HOLDER_LEN);
	tag->id_len = get_str(r, tag->id, EFS_MAX_ID_LEN);
	if (version >= 2) {
		j->counter = get_u(r, 8);
	}
	if (version == 3) {
		j->epoch = get_u(r, 8);
	}
	if ((version == 2 && j->counter == 0) || (version == 3 && j->epoch == 0)) {
		return 0;
	}
	j->id_len = get_str(r, j->id, EFS_FW_MAX_JOB);
	j->state = (uint8_t)get_u(r, 1);
	j->slot = (uint8_t)get_u(r, 1);
	get_into(r, j->image, 32);
	j->size = get_u(r, 8);
	j->chunk = get_u(r, 8);
	j->version = get_u(r, 8);
	j->bytes = get_u(r, 8);
	j->token = get_u(r, 8);
	j->seq = get_u(r, 8);
	j->reason_len = get_str(r, j->reason, EFS_FW_MAX_REASON);
	b->active = (uint8_t)get_u(r, 1);
	b->running = (uint8_t)get_u(r, 1);
	b->trial = (uint8_t)get_u(r, 1);
	b->tries = (uint8_t)get_u(r, 1);
	get_into(r, b->active_image, 32);
	get_into(r, b->trial_image, 32);
	b->active_size = get_u(r, 8);
	b->trial_size = get_u(r, 8);
	b->security = get_u(r, 8);
	b->boots = get_u(r, 8);
	tag->epoch = j->epoch;
	tag->mark.token = j->token;
	tag->mark.seq = j->seq;
	return !r->bad && r->i == r->n && valid(j, b);
}

enum { EMPTY, VALID, DAMAGED };

static uint32_t rd32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* superseded reads record sector s's superseded byte: 1 if a bit of it is
 * cleared (or it cannot be read); 0 if erased, or if the record (end bytes,
 * an older library's) leaves no room for it. */
static int superseded(const efs_fw_port *port, unsigned s, size_t end)
{
	uint8_t v = 0xff;

	if (end < port->record_sector_size &&
		port->record_read(port->user, s, port->record_sector_size - 1, &v, 1) != 0) {
		v = 0;
	}
	return v != 0xff;
}

/* supersede marks record sector s superseded (its last byte). */
static int supersede(const efs_fw_port *port, unsigned s)
{
	return efs_supersede(port->record_read, port->record_program, port->user, s, port->record_sector_size - 1);
}

/* read_slot reads record sector s into b and classifies it; a valid one
 * is decoded into j, bo and tag, its generation into *gen, whether it is
 * superseded into *sup. */
static int read_slot(const efs_fw_port *port, unsigned s, uint8_t b[EFS_FW_RECORD_SLOT_MAX], efs_fw_job *j,
	efs_fw_boot_state *bo, efs_mark_record *tag, uint32_t *gen, int *sup)
{
	size_t len;
	rbuf r;

	if (port->record_read(port->user, s, 0, b, 7) != 0) {
		return DAMAGED;
	}
	if (b[0] == 0xff) {
		return EMPTY;
	}
	len = (size_t)b[5] << 8 | b[6];
	if (len > EFS_FW_RECORD_MAX || port->record_read(port->user, s, 7, b + 7, len + 4) != 0 ||
		efs_crc32c(b + 1, 6 + len) != rd32(b + 7 + len)) {
		return DAMAGED;
	}
	r.p = b + 7;
	r.n = len;
	r.i = 0;
	r.bad = 0;
	*gen = rd32(b + 1);
	*sup = superseded(port, s, 11 + len);
	return *gen != 0 && decode(&r, j, bo, tag) ? VALID : DAMAGED;
}

efs_err efs_fw_load(efs_fw *fw, efs_mark_record *tag)
{
	uint8_t b[EFS_FW_RECORD_SLOT_MAX];
	efs_fw_job j;
	efs_fw_boot_state bo;
	efs_mark_record t;
	uint32_t gen = 0;
	int kind[2], sup[2] = { 0, 0 };
	unsigned old;

	fw->cur = -1;
	fw->gen = 0;
	for (unsigned s = 0; s < 2; s++) {
		kind[s] = read_slot(fw->port, s, b, &j, &bo, &t, &gen, &sup[s]);
		if (kind[s] == VALID && (fw->cur < 0 || gen > fw->gen)) {
			fw->job = j;
			fw->boot = bo;
			*tag = t;
			fw->gen = gen;
			fw->cur = (int8_t)s;
		}
	}
	old = fw->cur == 0 ? 1u : 0u;
	if (fw->cur < 0) {
		return kind[0] == DAMAGED || kind[1] == DAMAGED ? EFS_E_CORRUPT : EFS_OK;
	}
	if (kind[old] == DAMAGED && sup[fw->cur]) {
		memset(&fw->job, 0, sizeof fw->job); /* the newest record rotted: fail closed */
		memset(&fw->boot, 0, sizeof fw->boot);
		fw->cur = -1;
		fw->gen = 0;
		return EFS_E_CORRUPT;
	}
	if (kind[old] == VALID && !sup[old] && supersede(fw->port, old) != 0) {
		return EFS_E_STORAGE; /* a cut fell before the older one was marked: mark it now, or refuse */
	}
	return EFS_OK;
}

efs_err efs_fw_save(efs_fw *fw, const efs_fw_job *job, const efs_fw_boot_state *boot, efs_bytes holder,
	efs_bytes id)
{
	const efs_fw_port *port = fw->port;
	uint8_t b[EFS_FW_RECORD_SLOT_MAX], back[32], commit = COMMIT;
	wbuf w = { b + 7, 0, EFS_FW_RECORD_MAX, 0 };
	unsigned s = fw->cur == 0 ? 1u : 0u;
	size_t total;
	int old;

	encode(&w, job, boot, holder, id);
	total = 11 + w.n;
	if (w.bad || fw->gen == UINT32_MAX || port->record_sector_size <= total) { /* and the superseded byte */
		return EFS_E_STORAGE;
	}
	b[0] = 0xff;
	w.p = b;
	w.n = 1;
	w.cap = sizeof b;
	put_u(&w, fw->gen + 1, 4);
	put_u(&w, total - 11, 2);
	w.n = total - 4;
	put_u(&w, efs_crc32c(b + 1, total - 5), 4);
	if (port->record_erase(port->user, s) != 0 || port->record_program(port->user, s, 1, b + 1, total - 1) != 0) {
		return EFS_E_STORAGE;
	}
	for (size_t off = 1; off < total; off += sizeof back) { /* read back */
		size_t k = total - off < sizeof back ? total - off : sizeof back;
		if (port->record_read(port->user, s, (uint32_t)off, back, k) != 0 || !efs_bytes_equal(b + off, k, back, k)) {
			return EFS_E_STORAGE;
		}
	}
	if (port->record_program(port->user, s, 0, &commit, 1) != 0 || port->record_read(port->user, s, 0, back, 1) != 0 ||
		back[0] != COMMIT) {
		return EFS_E_STORAGE;
	}
	if (job != &fw->job) {
		fw->job = *job;
	}
	if (boot != &fw->boot) {
		fw->boot = *boot;
	}
	fw->gen++;
	old = fw->cur;
	fw->cur = (int8_t)s;
	if (old >= 0 && supersede(port, (unsigned)old) != 0) {
		fw->broken = 1; /* the record moved (fw follows it), the step is refused: reopen */
		return EFS_E_STORAGE;
	}
	return EFS_OK;
}

int efs_fw_hash_slot(const efs_fw_port *port, unsigned slot, uint64_t size, uint8_t out[32])
{
	efs_sha256_ctx h;
	uint8_t b[64];

	efs_sha256_init(&h);
	for (uint64_t off = 0; off < size; off += sizeof b) {
		size_t k = size - off < sizeof b ? (size_t)(size - off) : sizeof b;
		if (port->slot_read(port->user, slot, (uint32_t)off, b, k) != 0) {
			return -1;
		}
		efs_sha256_update(&h, b, k);
	}
	efs_sha256_final(&h, out);
	return 0;
}
