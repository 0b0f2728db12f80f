/*
 * Durable marks on flash: fence.MarkRecord's encoding (CRC-32C, the time
 * stored as 0; version 1 for a mark of epoch 0, version 2 with the epoch it
 * was accepted in) in one of two alternating slots, one per sector:
 *
 *	offset  size  field
 *	0       1     commit byte EFS_SLOT_COMMIT, programmed last
 *	1       4     generation, big-endian, from 1
 *	5       1     record length L
 *	6       L     fence.MarkRecord encoding
 *	6+L     4     CRC-32C of bytes 1 to 6+L
 *
 * Once an operator's reset was applied the slot also holds its counter
 * (format 2; format 1 is still read, and written while there was no
 * reset, so a device that never had one keeps its bytes):
 *
 *	0       1     commit byte
 *	1       4     generation
 *	5       1     0 (format 2: a format 1 slot has L >= 31 here)
 *	6       1     record length L
 *	7       L     fence.MarkRecord encoding
 *	7+L     8     reset counter, big-endian, not 0
 *	15+L    4     CRC-32C of bytes 1 to 15+L
 *
 * A reset of an epoch (every reset since resets have one) adds its epoch
 * (format 3; format 2 is still read, and written while the last reset is
 * one of epoch 0):
 *
 *	5       1     1 (format 3)
 *	6       1     record length L
 *	7       L     fence.MarkRecord encoding
 *	7+L     8     reset counter, not 0
 *	15+L    8     reset epoch, not 0
 *	23+L    4     CRC-32C of bytes 1 to 23+L
 *
 * So the mark, its epoch, the reset counter and the reset's epoch are made
 * durable together by one commit byte.
 *
 * The sector's last byte, outside every slot and its CRC, is the slot's
 * superseded byte: erased with the sector, programmed to 0 once a newer
 * slot is complete in the other sector (any bit of it cleared: set).
 *
 * A new mark goes to the sector that does not hold the newest valid slot:
 * erase it, program bytes 1.., read them back, program the commit byte, read
 * it back, then program the older slot's superseded byte, read it back; only
 * then is the mark stored. The newest complete slot is never erased, so a
 * power cut at any byte of the write (or of the erase) leaves it valid. A
 * slot whose commit byte is still erased is a write that never finished:
 * empty. A slot with the commit byte (or any of its bits) set that fails its
 * checksum is damaged: the older one rotted, or its erase or rewrite was cut
 * (the mark it held is behind the newest anyway) if the valid slot is not
 * superseded; the newest one rotted if it is (efs_open fails closed, as
 * devices/shim on a corrupt record: the older mark is below one a command
 * was applied at). Slots of an older library have the byte erased: both
 * valid, efs_open marks the older one.
 */
#include <string.h>

#include "efs_internal.h"

#define EFS_SLOT_COMMIT 0x5a
#define EFS_SLOT_SUPERSEDED 0x00

uint32_t efs_crc32c(const uint8_t *b, size_t n)
{
	uint32_t c = 0xffffffffu;

	for (size_t i = 0; i < n; i++) {
		c ^= b[i];
		for (int k = 0; k < 8; k++) {
			c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
		}
	}
	return ~c;
}

static void be(uint8_t *p, uint64_t v, int n)
{
	for (int k = 0; k < n; k++) {
		p[k] = (uint8_t)(v >> (8 * (n - 1 - k)));
	}
}

static uint64_t rbe(const uint8_t *p, int n)
{
	uint64_t v = 0;

	for (int k = 0; k < n; k++) {
		v = (v << 8) | p[k];
	}
	return v;
}

/* encode writes fence.MarkRecord's encoding of the mark m accepted in
 * epoch, holder and id to out: version 1 for epoch 0, else version 2 with
 * the epoch. */
static EFS_INLINE efs_err encode(const efs_mark *m, uint64_t epoch, const efs_bytes *holder, const efs_bytes *id,
	uint8_t *out, size_t cap, size_t *n)
{
	size_t len = (epoch != 0 ? 39u : 31u) + holder->n + id->n;
	uint8_t *p = out;

	if (m->token == 0 || m->seq == 0 || holder->n > EFS_MAX_HOLDER_LEN || id->n > EFS_MAX_ID_LEN ||
		!efs_utf8_valid(holder->p, holder->n) || !efs_utf8_valid(id->p, id->n)) {
		return EFS_E_ACK;
	}
	if (cap < len) {
		return EFS_E_BUFFER;
	}
	*p++ = epoch != 0 ? 2 : 1;
	if (epoch != 0) {
		be(p, epoch, 8);
		p += 8;
	}
	be(p, m->token, 8);
	be(p + 8, m->seq, 8);
	memset(p + 16, 0, 8); /* no clock: time unknown */
	p += 24;
	*p++ = (uint8_t)holder->n;
	if (holder->n > 0) {
		memcpy(p, holder->p, holder->n);
	}
	p += holder->n;
	*p++ = (uint8_t)id->n;
	if (id->n > 0) {
		memcpy(p, id->p, id->n);
	}
	p += id->n;
	be(p, efs_crc32c(out, len - 4), 4);
	*n = len;
	return EFS_OK;
}

efs_err efs_mark_record_encode(const efs_mark_record *r, uint8_t *out, size_t cap, size_t *n)
{
	efs_bytes holder = { r->holder, r->holder_len }, id = { r->id, r->id_len };

	return encode(&r->mark, r->epoch, &holder, &id, out, cap, n);
}

/* parse checks a stored record and returns its state, and where its
 * holder and id are: b + *h, b[*h - 1] bytes; b + *i, b[*i - 1] bytes. */
static efs_err parse(const uint8_t *b, size_t n, efs_state *st, size_t *h, size_t *i)
{
	size_t f = n >= 39 && b[0] == 2 ? 9 : 1; /* the fields after the version (and the epoch) */

	if (n < 31 || efs_crc32c(b, n - 4) != (uint32_t)rbe(b + n - 4, 4) || (b[0] != 1 && f == 1)) {
		return EFS_E_CORRUPT;
	}
	*h = f + 25;
	if (b[*h - 1] > EFS_MAX_HOLDER_LEN || *h + b[*h - 1] >= n - 4) {
		return EFS_E_CORRUPT;
	}
	*i = *h + b[*h - 1] + 1;
	if (b[*i - 1] > EFS_MAX_ID_LEN || *i + b[*i - 1] != n - 4) {
		return EFS_E_CORRUPT;
	}
	st->epoch = f == 9 ? rbe(b + 1, 8) : 0;
	st->mark.token = rbe(b + f, 8);
	st->mark.seq = rbe(b + f + 8, 8);
	if ((f == 9 && st->epoch == 0) || st->mark.token == 0 || st->mark.seq == 0 ||
		!efs_utf8_valid(b + *h, b[*h - 1]) || !efs_utf8_valid(b + *i, b[*i - 1])) {
		return EFS_E_CORRUPT;
	}
	return EFS_OK;
}

efs_err efs_mark_record_decode(const uint8_t *b, size_t n, efs_mark_record *r)
{
	size_t h, i;
	efs_state st;

	memset(r, 0, sizeof *r);
	if (parse(b, n, &st, &h, &i) != EFS_OK) {
		return EFS_E_CORRUPT;
	}
	r->epoch = st.epoch;
	r->mark = st.mark;
	r->holder_len = b[h - 1];
	memcpy(r->holder, b + h, r->holder_len);
	r->id_len = b[i - 1];
	memcpy(r->id, b + i, r->id_len);
	return EFS_OK;
}

enum { SLOT_EMPTY, SLOT_VALID, SLOT_DAMAGED };

/* A valid slot's contents: the record at b + at, len bytes. */
typedef struct {
	efs_state st;
	uint32_t gen;
	size_t at, len;
	uint64_t counter, reset_epoch;
	int sup; /* its superseded byte has a bit cleared */
} slot_info;

/* read_slot reads sector s into b and classifies it; for a valid slot it
 * fills *si. */
static int read_slot(const efs_port *port, unsigned s, uint8_t b[EFS_MARK_SLOT_MAX], slot_info *si)
{
	size_t h, i, extra;
	uint8_t sup = 0xff;

	if (port->flash_read(port->user, s, 0, b, 7) != 0) {
		return SLOT_DAMAGED;
	}
	if (b[0] == 0xff) {
		return SLOT_EMPTY; /* never committed */
	}
	si->at = b[5] <= 1 ? 7 : 6; /* format 2 or 3, or 1 */
	extra = b[5] == 1 ? 16 : b[5] == 0 ? 8 : 0;
	si->len = b[si->at - 1];
	if (si->len < 31 || si->len > EFS_MARK_RECORD_MAX ||
		port->flash_read(port->user, s, 7, b + 7, si->at + si->len + extra + 4 - 7) != 0 ||
		efs_crc32c(b + 1, si->at - 1 + si->len + extra) != (uint32_t)rbe(b + si->at + si->len + extra, 4) ||
		parse(b + si->at, si->len, &si->st, &h, &i) != EFS_OK) {
		return SLOT_DAMAGED;
	}
	si->counter = extra ? rbe(b + si->at + si->len, 8) : 0;
	si->reset_epoch = extra == 16 ? rbe(b + si->at + si->len + 8, 8) : 0;
	si->gen = (uint32_t)rbe(b + 1, 4);
	/* A slot of an older library that fills its sector has no superseded
	 * byte: not superseded. An unreadable one counts as set. */
	if (si->at + si->len + extra + 4 < port->sector_size &&
		port->flash_read(port->user, s, port->sector_size - 1, &sup, 1) != 0) {
		sup = 0;
	}
	si->sup = sup != 0xff;
	return si->gen == 0 || (extra && si->counter == 0) || (extra == 16 && si->reset_epoch == 0) ? SLOT_DAMAGED :
												    SLOT_VALID;
}

int efs_supersede(efs_read_fn rd, efs_program_fn pg, void *user, unsigned s, uint32_t at)
{
	uint8_t v, z = EFS_SLOT_SUPERSEDED;

	for (int k = 0; k < 2; k++) { /* read; program if erased, read back */
		if (rd(user, s, at, &v, 1) != 0) {
			return -1;
		}
		if (v != 0xff) {
			return 0;
		}
		if (k == 0 && pg(user, s, at, &z, 1) != 0) {
			return -1;
		}
	}
	return -1;
}

/* supersede marks the slot in sector s superseded (its last byte). */
static int supersede(const efs_port *port, unsigned s)
{
	return efs_supersede(port->flash_read, port->flash_program, port->user, s, port->sector_size - 1);
}

efs_err efs_open(efs_ctx *c, const efs_port *port)
{
	uint8_t b[EFS_MARK_SLOT_MAX];
	slot_info si;
	int kind[2], sup[2];
	unsigned old;

	memset(c, 0, sizeof *c);
	c->port = port;
	c->cur = -1;
	for (unsigned s = 0; s < 2; s++) {
		kind[s] = read_slot(port, s, b, &si);
		sup[s] = kind[s] == SLOT_VALID && si.sup;
		if (kind[s] == SLOT_VALID && (c->cur < 0 || si.gen > c->gen)) {
			c->mark = si.st.mark;
			c->epoch = si.st.epoch;
			c->gen = si.gen;
			c->cur = (int8_t)s;
			c->reset_counter = si.counter;
			c->reset_epoch = si.reset_epoch;
		}
	}
	old = c->cur == 0 ? 1u : 0u;
	if ((c->cur < 0 && (kind[0] == SLOT_DAMAGED || kind[1] == SLOT_DAMAGED)) ||
		(c->cur >= 0 && kind[old] == SLOT_DAMAGED && sup[c->cur])) {
		c->corrupt = 1; /* no valid slot, or the newest one rotted: fail closed */
		return EFS_E_CORRUPT;
	}
	if (c->cur >= 0 && kind[old] == SLOT_VALID && !sup[old] && supersede(port, old) != 0) {
		c->corrupt = 1; /* a cut fell before the older slot was marked: mark it now, or refuse */
		return EFS_E_STORAGE;
	}
	return EFS_OK;
}

efs_err efs_read_mark_record(const efs_ctx *c, efs_mark_record *r)
{
	uint8_t b[EFS_MARK_SLOT_MAX];
	slot_info si;

	memset(r, 0, sizeof *r);
	if (c->corrupt) {
		return EFS_E_CORRUPT;
	}
	if (c->cur < 0) {
		return EFS_OK;
	}
	if (read_slot(c->port, (unsigned)c->cur, b, &si) != SLOT_VALID) {
		return EFS_E_CORRUPT;
	}
	return efs_mark_record_decode(b + si.at, si.len, r);
}

/* efs_store_reset writes the mark m (set by the command id, from holder)
 * in epoch, the last reset's counter (0: none, format 1) and epoch (0:
 * none, format 2 if a counter) — rs's, or the context's if rs is NULL — as
 * the newest slot, reads it back, then commits it: one write, one commit
 * byte; then marks the older slot superseded. On success c holds them
 * all; also on EFS_E_STORAGE from that last step (the new slot is the
 * newest on flash). */
efs_err efs_store_reset(efs_ctx *c, const efs_mark *m, uint64_t epoch, const efs_bytes *holder, const efs_bytes *id,
	const efs_reset *rs)
{
	const efs_port *port = c->port;
	uint64_t counter = rs != NULL ? rs->counter : c->reset_counter, reset_epoch = rs != NULL ? rs->epoch : c->reset_epoch;
	uint8_t b[EFS_MARK_SLOT_MAX], back[16];
	unsigned s = c->cur == 0 ? 1u : 0u;
	size_t at = counter != 0 ? 7 : 6, extra = reset_epoch != 0 ? 16 : counter != 0 ? 8 : 0, len, end;
	uint8_t commit = EFS_SLOT_COMMIT;
	int old;

	if (c->gen == UINT32_MAX || encode(m, epoch, holder, id, b + at, sizeof b - at - extra - 4, &len) != EFS_OK ||
		port->sector_size < at + len + extra + 5) { /* the slot and its superseded byte */
		return EFS_E_STORAGE; /* 2^32 writes: beyond any flash's endurance */
	}
	end = at + len + extra + 4;
	b[0] = 0xff;
	be(b + 1, c->gen + 1, 4);
	b[5] = (uint8_t)(reset_epoch != 0 ? 1 : counter != 0 ? 0 : len);
	if (counter != 0) { /* format 2, or 3 with the reset's epoch */
		b[6] = (uint8_t)len;
		be(b + at + len, counter, 8);
		if (reset_epoch != 0) {
			be(b + at + len + 8, reset_epoch, 8);
		}
	}
	be(b + end - 4, efs_crc32c(b + 1, end - 5), 4);
	if (port->flash_erase(port->user, s) != 0 || port->flash_program(port->user, s, 1, b + 1, end - 1) != 0) {
		return EFS_E_STORAGE;
	}
	for (size_t off = 1; off < end; off += sizeof back) { /* read back */
		size_t k = end - off < sizeof back ? end - off : sizeof back;
		if (port->flash_read(port->user, s, (uint32_t)off, back, k) != 0 || !efs_bytes_equal(b + off, k, back, k)) {
			return EFS_E_STORAGE;
		}
	}
	if (port->flash_program(port->user, s, 0, &commit, 1) != 0 || port->flash_read(port->user, s, 0, back, 1) != 0 ||
		back[0] != commit) {
		return EFS_E_STORAGE;
	}
	/* The new slot is complete: the context follows it. A failure to
	 * mark the older one superseded refuses the command all the same
	 * (a power cut there leaves the new mark, not applied). */
	old = c->cur;
	c->mark = *m;
	c->epoch = epoch;
	c->gen++;
	c->cur = (int8_t)s;
	c->reset_counter = counter;
	c->reset_epoch = reset_epoch;
	return old >= 0 && supersede(port, (unsigned)old) != 0 ? EFS_E_STORAGE : EFS_OK;
}
