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

/* read_slot reads sector s into b and classifies it; for a valid slot it
 * sets *m, *gen and *len (the record's, at b + 6). */
static int read_slot(const efs_port *port, unsigned s, uint8_t b[EFS_MARK_SLOT_MAX], efs_mark *m, uint32_t *gen,
	size_t *len)
{
	size_t h, i;

	if (port->flash_read(port->user, s, 0, b, 6) != 0) {
		return SLOT_DAMAGED;
	}
	if (b[0] == 0xff) {
		return SLOT_EMPTY; /* never committed */
	}
	*len = b[5];
	if (*len < 31 || *len > EFS_MARK_RECORD_MAX ||
		port->flash_read(port->user, s, 6, b + 6, *len + 4) != 0 ||
		efs_crc32c(b + 1, 5 + *len) != (uint32_t)rbe(b + 6 + *len, 4) || parse(b + 6, *len, m, &h, &i) != EFS_OK) {
		return SLOT_DAMAGED;
	}
	*gen = (uint32_t)rbe(b + 1, 4);
	return *gen == 0 ? SLOT_DAMAGED : SLOT_VALID;
}

efs_err efs_open(efs_ctx *c, const efs_port *port)
{
	uint8_t b[EFS_MARK_SLOT_MAX];
	efs_mark m;
	uint32_t gen;
	size_t len;
	int damaged = 0;

	memset(c, 0, sizeof *c);
	c->port = port;
	c->cur = -1;
	for (unsigned s = 0; s < 2; s++) {
		switch (read_slot(port, s, b, &m, &gen, &len)) {
		case SLOT_VALID:
			if (c->cur < 0 || gen > c->gen) {
				c->mark = m;
				c->gen = gen;
				c->cur = (int8_t)s;
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
	efs_mark m;
	uint32_t gen;
	size_t len;

	memset(r, 0, sizeof *r);
	if (c->corrupt) {
		return EFS_E_CORRUPT;
	}
	if (c->cur < 0) {
		return EFS_OK;
	}
	if (read_slot(c->port, (unsigned)c->cur, b, &m, &gen, &len) != SLOT_VALID) {
		return EFS_E_CORRUPT;
	}
	return efs_mark_record_decode(b + 6, len, r);
}

/* efs_store writes the mark m (set by the command id, from holder) as the
 * newest slot, reads it back, then commits it; on success c holds it. */
efs_err efs_store(efs_ctx *c, efs_mark m, efs_bytes holder, efs_bytes id)
{
	const efs_port *port = c->port;
	uint8_t b[EFS_MARK_SLOT_MAX], back[32];
	unsigned s = c->cur == 0 ? 1u : 0u;
	size_t len;
	uint8_t commit = EFS_SLOT_COMMIT;

	if (c->gen == UINT32_MAX || encode(m, holder, id, b + 6, sizeof b - 10, &len) != EFS_OK ||
		port->sector_size < 10 + len) {
		return EFS_E_STORAGE; /* 2^32 writes: beyond any flash's endurance */
	}
	b[0] = 0xff;
	be(b + 1, c->gen + 1, 4);
	b[5] = (uint8_t)len;
	be(b + 6 + len, efs_crc32c(b + 1, 5 + len), 4);
	if (port->flash_erase(port->user, s) != 0 || port->flash_program(port->user, s, 1, b + 1, 9 + len) != 0) {
		return EFS_E_STORAGE;
	}
	for (size_t off = 1; off < 10 + len; off += sizeof back) { /* read back */
		size_t k = 10 + len - off < sizeof back ? 10 + len - off : sizeof back;
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
	return EFS_OK;
}
