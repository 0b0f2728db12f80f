/*
 * Durable marks on flash: fence.MarkRecord's encoding (version 1, CRC-32C,
 * the time stored as 0) in one of two alternating slots, one per sector:
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
 * A new mark goes to the sector that does not hold the newest valid slot:
 * erase it, program bytes 1.., read them back, program the commit byte.
 * The newest complete slot is never touched, so a power cut at any byte of
 * the write (or of the erase) leaves it valid. A slot whose commit byte is
 * still erased is a write that never finished: empty. A slot with the commit
 * byte (or any of its bits) set that fails its checksum is damaged.
 */
#include <string.h>

#include "efs_internal.h"

#define EFS_SLOT_COMMIT 0x5a

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

/* encode writes fence.MarkRecord's encoding of m, holder and id to out. */
static efs_err encode(efs_mark m, efs_bytes holder, efs_bytes id, uint8_t *out, size_t cap, size_t *n)
{
	size_t len = 31u + holder.n + id.n;
	uint8_t *p = out;

	if (m.token == 0 || m.seq == 0 || holder.n > EFS_MAX_HOLDER_LEN || id.n > EFS_MAX_ID_LEN ||
		!efs_utf8_valid(holder.p, holder.n) || !efs_utf8_valid(id.p, id.n)) {
		return EFS_E_ACK;
	}
	if (cap < len) {
		return EFS_E_BUFFER;
	}
	*p++ = 1;
	be(p, m.token, 8);
	be(p + 8, m.seq, 8);
	memset(p + 16, 0, 8); /* no clock: time unknown */
	p += 24;
	*p++ = (uint8_t)holder.n;
	if (holder.n > 0) {
		memcpy(p, holder.p, holder.n);
	}
	p += holder.n;
	*p++ = (uint8_t)id.n;
	if (id.n > 0) {
		memcpy(p, id.p, id.n);
	}
	p += id.n;
	be(p, efs_crc32c(out, len - 4), 4);
	*n = len;
	return EFS_OK;
}

efs_err efs_mark_record_encode(const efs_mark_record *r, uint8_t *out, size_t cap, size_t *n)
{
	efs_bytes holder = { r->holder, r->holder_len }, id = { r->id, r->id_len };

	return encode(r->mark, holder, id, out, cap, n);
}

/* parse checks a stored record and returns its mark, and where its
 * holder and id are: b + 26, h bytes; b + 27 + h, i bytes. */
static efs_err parse(const uint8_t *b, size_t n, efs_mark *m, size_t *h, size_t *i)
{
	if (n < 31 || efs_crc32c(b, n - 4) != (uint32_t)rbe(b + n - 4, 4) || b[0] != 1) {
		return EFS_E_CORRUPT;
	}
	*h = b[25];
	if (*h > EFS_MAX_HOLDER_LEN || 26 + *h >= n - 4) {
		return EFS_E_CORRUPT;
	}
	*i = b[26 + *h];
	if (*i > EFS_MAX_ID_LEN || 27 + *h + *i != n - 4) {
		return EFS_E_CORRUPT;
	}
	m->token = rbe(b + 1, 8);
	m->seq = rbe(b + 9, 8);
	if (m->token == 0 || m->seq == 0 || !efs_utf8_valid(b + 26, *h) || !efs_utf8_valid(b + 27 + *h, *i)) {
		return EFS_E_CORRUPT;
	}
	return EFS_OK;
}

efs_err efs_mark_record_decode(const uint8_t *b, size_t n, efs_mark_record *r)
{
	size_t h, i;

	memset(r, 0, sizeof *r);
	if (parse(b, n, &r->mark, &h, &i) != EFS_OK) {
		memset(r, 0, sizeof *r);
		return EFS_E_CORRUPT;
	}
	r->holder_len = (uint8_t)h;
	memcpy(r->holder, b + 26, h);
	r->id_len = (uint8_t)i;
	memcpy(r->id, b + 27 + h, i);
	return EFS_OK;
}

enum { SLOT_EMPTY, SLOT_VALID, SLOT_DAMAGED };

/* A valid slot's contents: the record at b + at, len bytes. */
typedef struct {
	efs_mark mark;
	uint32_t gen;
	size_t at, len;
	uint64_t counter;
} slot_info;

/* read_slot reads sector s into b and classifies it; for a valid slot it
 * fills *si. */
static int read_slot(const efs_port *port, unsigned s, uint8_t b[EFS_MARK_SLOT_MAX], slot_info *si)
{
	size_t h, i, extra;

	if (port->flash_read(port->user, s, 0, b, 7) != 0) {
		return SLOT_DAMAGED;
	}
	if (b[0] == 0xff) {
		return SLOT_EMPTY; /* never committed */
	}
	si->at = b[5] == 0 ? 7 : 6; /* format 2, or 1 */
	extra = b[5] == 0 ? 8 : 0;
	si->len = b[si->at - 1];
	if (si->len < 31 || si->len > EFS_MARK_RECORD_MAX ||
		port->flash_read(port->user, s, 7, b + 7, si->at + si->len + extra + 4 - 7) != 0 ||
		efs_crc32c(b + 1, si->at - 1 + si->len + extra) != (uint32_t)rbe(b + si->at + si->len + extra, 4) ||
		parse(b + si->at, si->len, &si->mark, &h, &i) != EFS_OK) {
		return SLOT_DAMAGED;
	}
	si->counter = extra ? rbe(b + si->at + si->len, 8) : 0;
	si->gen = (uint32_t)rbe(b + 1, 4);
	return si->gen == 0 || (extra && si->counter == 0) ? SLOT_DAMAGED : SLOT_VALID;
}

efs_err efs_open(efs_ctx *c, const efs_port *port)
{
	uint8_t b[EFS_MARK_SLOT_MAX];
	slot_info si;
	int damaged = 0;

	memset(c, 0, sizeof *c);
	c->port = port;
	c->cur = -1;
	for (unsigned s = 0; s < 2; s++) {
		switch (read_slot(port, s, b, &si)) {
		case SLOT_VALID:
			if (c->cur < 0 || si.gen > c->gen) {
				c->mark = si.mark;
				c->gen = si.gen;
				c->cur = (int8_t)s;
				c->reset_counter = si.counter;
			}
			break;
		case SLOT_DAMAGED:
			damaged = 1;
			break;
		default:
			break;
		}
	}
	if (c->cur < 0 && damaged) {
		c->corrupt = 1;
		return EFS_E_CORRUPT;
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
 * and the reset counter counter (0: none, format 1) as the newest slot,
 * reads it back, then commits it: one write, one commit byte. On success c
 * holds both. efs_store (efs_internal.h) keeps the counter held. */
efs_err efs_store_reset(efs_ctx *c, efs_mark m, efs_bytes holder, efs_bytes id, uint64_t counter)
{
	const efs_port *port = c->port;
	uint8_t b[EFS_MARK_SLOT_MAX], back[32];
	unsigned s = c->cur == 0 ? 1u : 0u;
	size_t at = counter != 0 ? 7 : 6, extra = counter != 0 ? 8 : 0, len, end;
	uint8_t commit = EFS_SLOT_COMMIT;

	if (c->gen == UINT32_MAX || encode(m, holder, id, b + at, sizeof b - at - extra - 4, &len) != EFS_OK ||
		port->sector_size < at + len + extra + 4) {
		return EFS_E_STORAGE; /* 2^32 writes: beyond any flash's endurance */
	}
	end = at + len + extra + 4;
	b[0] = 0xff;
	be(b + 1, c->gen + 1, 4);
	b[5] = (uint8_t)(counter != 0 ? 0 : len);
	if (counter != 0) { /* format 2 */
		b[6] = (uint8_t)len;
		be(b + at + len, counter, 8);
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
	c->mark = m;
	c->gen++;
	c->cur = (int8_t)s;
	c->reset_counter = counter;
	return EFS_OK;
}
