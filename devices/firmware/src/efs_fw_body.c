/*
 * A firmware step's body (devices/fwjob's body.go): a CBOR map with text
 * keys matched to the step's fields as fxamacker/cbor matches struct
 * fields (exact name, else ASCII case-insensitive); null or undefined is a
 * missing field; an unknown key, a field twice or a value of another type
 * refuse the step (fwjob.ErrCommand). The envelope decoder has walked the
 * body already (well-formed, within the limits, no duplicate keys).
 */
#include <string.h>

#include "efs_fw_internal.h"

void efs_fw_add(efs_fw_text *t, const char *s)
{
	efs_text_add(t->buf, t->cap, &t->at, s);
}

void efs_fw_add_bytes(efs_fw_text *t, efs_bytes b)
{
	for (size_t i = 0; i < b.n && t->at + 1 < t->cap; i++) {
		t->buf[t->at++] = b.p[i] == 0 ? '?' : (char)b.p[i];
	}
	t->buf[t->at] = '\0';
}

void efs_fw_add_u64(efs_fw_text *t, uint64_t v)
{
	efs_text_u64(t->buf, t->cap, &t->at, v);
}

void efs_fw_add_short(efs_fw_text *t, const uint8_t h[32])
{
	static const char hex[] = "0123456789abcdef";
	char s[20];

	for (int i = 0; i < 8; i++) {
		s[2 * i] = hex[h[i] >> 4];
		s[2 * i + 1] = hex[h[i] & 15];
	}
	s[16] = '\xe2'; /* U+2026 */
	s[17] = '\x80';
	s[18] = '\xa6';
	s[19] = '\0';
	efs_fw_add(t, s);
}

enum { F_JOB, F_IMAGE, F_SIZE, F_VERSION, F_CHUNK, F_MANIFEST, F_OFF, F_DATA, F_N };

static const char *const field_names[F_N] = { "job", "image", "size", "version", "chunk", "manifest", "off", "data" };

/* fields is the set of fields (bits) of a kind's body. */
static unsigned fields(int kind)
{
	switch (kind) {
	case FW_BEGIN:
		return 1u << F_JOB | 1u << F_IMAGE | 1u << F_SIZE | 1u << F_VERSION | 1u << F_CHUNK | 1u << F_MANIFEST;
	case FW_CHUNK:
		return 1u << F_JOB | 1u << F_OFF | 1u << F_DATA;
	default:
		return 1u << F_JOB;
	}
}

static int lower(int c)
{
	return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* field finds key among the kind's fields: exact, else case-insensitive. */
static int field(unsigned set, efs_bytes key)
{
	for (int pass = 0; pass < 2; pass++) {
		for (int f = 0; f < F_N; f++) {
			const char *name = field_names[f];
			size_t i = 0;

			if (!(set & 1u << f)) {
				continue;
			}
			while (i < key.n && name[i] != '\0' &&
				(pass == 0 ? key.p[i] == (uint8_t)name[i] : lower(key.p[i]) == name[i])) {
				i++;
			}
			if (i == key.n && name[i] == '\0') {
				return f;
			}
		}
	}
	return -1;
}

typedef struct {
	efs_bytes b[F_N];
	uint64_t u[F_N];
	unsigned present; /* fields with a value (not null) */
	unsigned seen;
} body_fields;

int efs_fw_value_head(efs_rd *r, efs_head *h)
{
	if (efs_read_head(r, h) != EFS_OK) {
		return -1;
	}
	return h->major == 7 && (h->ai == 22 || h->ai == 23) ? 0 : 1;
}

/* value reads field f's value: text (job), bytes (image, manifest, data) or
 * an unsigned integer; null and undefined leave it missing. */
static int value(efs_rd *r, int f, body_fields *bf)
{
	efs_head h;
	size_t at = r->i;
	int v = efs_fw_value_head(r, &h);

	if (v <= 0) {
		return v;
	}
	if (f == F_JOB ? h.major != 3 : (f == F_IMAGE || f == F_MANIFEST || f == F_DATA) ? h.major != 2 : h.major != 0) {
		r->i = at;
		return -1;
	}
	bf->present |= 1u << f;
	bf->u[f] = h.arg;
	if (h.major == 2 || h.major == 3) {
		bf->b[f].p = r->b + r->i;
		bf->b[f].n = (size_t)h.arg;
		r->i += (size_t)h.arg;
	}
	return 0;
}

/* read_body fills bf from the body: 0, or -1 with the reason in t. */
static int read_body(const efs_envelope *env, int kind, body_fields *bf, efs_fw_text *t)
{
	efs_rd r = { env->body.p, env->body.n, 0 };
	efs_head h;

	if (efs_read_head(&r, &h) != EFS_OK || (h.major != 5 && !(h.major == 7 && (h.ai == 22 || h.ai == 23)))) {
		efs_fw_add(t, " body: not a map");
		return -1;
	}
	for (uint64_t k = 0; h.major == 5 && k < h.arg; k++) {
		efs_head kh;
		efs_bytes key;
		int f;

		if (efs_read_head(&r, &kh) != EFS_OK || kh.major != 3) {
			efs_fw_add(t, " body: a key that is not text");
			return -1;
		}
		key.p = r.b + r.i;
		key.n = (size_t)kh.arg;
		r.i += key.n;
		if ((f = field(fields(kind), key)) < 0) {
			efs_fw_add(t, ": unknown field \"");
			efs_fw_add_bytes(t, key);
			efs_fw_add(t, "\"");
			return -1;
		}
		if ((bf->seen & 1u << f) || value(&r, f, bf) != 0) {
			efs_fw_add(t, " body: field ");
			efs_fw_add(t, field_names[f]);
			efs_fw_add(t, (bf->seen & 1u << f) ? " twice" : " of the wrong type");
			return -1;
		}
		bf->seen |= 1u << f;
	}
	return 0;
}

static const char *const kinds[] = { "fw.begin", "fw.chunk", "fw.install", "fw.activate", "fw.commit", "fw.cancel" };

static int kind_of(efs_bytes k)
{
	for (int i = 0; i < 6; i++) {
		size_t n = 0;

		while (kinds[i][n] != '\0') {
			n++;
		}
		if (efs_bytes_equal(k.p, k.n, (const uint8_t *)kinds[i], n)) {
			return FW_BEGIN + i;
		}
	}
	return 0;
}

/* job_ok is fwjob's jobID: 1..EFS_FW_MAX_JOB bytes of UTF-8 without
 * control characters (C0, DEL, C1). */
static int job_ok(efs_bytes j)
{
	if (j.n == 0 || j.n > EFS_FW_MAX_JOB || !efs_utf8_valid(j.p, j.n)) {
		return 0;
	}
	for (size_t i = 0; i < j.n; i++) {
		if (j.p[i] < 0x20 || j.p[i] == 0x7f || (j.p[i] == 0xc2 && i + 1 < j.n && j.p[i + 1] < 0xa0)) {
			return 0;
		}
	}
	return 1;
}

static efs_fw_err bad(efs_fw_text *t, const char *what)
{
	efs_fw_add(t, what);
	return EFS_FW_E_COMMAND;
}

/* bounds checks a begin's or a chunk's fields (fwjob's parseBegin and
 * parseChunk after the job id). */
static efs_fw_err bounds(const efs_fw_port *port, const body_fields *bf, efs_fw_step *s, efs_fw_text *t)
{
	unsigned need = 1u << F_SIZE | 1u << F_VERSION | 1u << F_CHUNK;

	if (s->kind == FW_CHUNK) {
		if (!(bf->present & 1u << F_OFF)) {
			return bad(t, "fw.chunk needs off");
		}
		if (s->data.n == 0 || s->data.n > EFS_FW_MAX_CHUNK) {
			efs_fw_add(t, "fw.chunk: data of ");
			efs_fw_add_u64(t, s->data.n);
			efs_fw_add(t, " bytes outside 1..");
			efs_fw_add_u64(t, EFS_FW_MAX_CHUNK);
			return EFS_FW_E_COMMAND;
		}
		return EFS_FW_OK;
	}
	if (s->image.n != 32) {
		efs_fw_add(t, "fw.begin: image must be a 32-byte SHA-256, got ");
		efs_fw_add_u64(t, s->image.n);
		return bad(t, " bytes");
	}
	if ((bf->present & need) != need) {
		return bad(t, "fw.begin needs size, version and chunk");
	}
	if (s->size == 0 || s->size > port->slot_size) {
		efs_fw_add(t, "fw.begin: size ");
		efs_fw_add_u64(t, s->size);
		efs_fw_add(t, " outside 1..");
		efs_fw_add_u64(t, port->slot_size);
		return EFS_FW_E_COMMAND;
	}
	if (s->chunk == 0 || s->chunk > EFS_FW_MAX_CHUNK) {
		efs_fw_add(t, "fw.begin: chunk ");
		efs_fw_add_u64(t, s->chunk);
		efs_fw_add(t, " outside 1..");
		efs_fw_add_u64(t, EFS_FW_MAX_CHUNK);
		return EFS_FW_E_COMMAND;
	}
	if (s->manifest.n > EFS_FW_MAX_MANIFEST) {
		efs_fw_add(t, "fw.begin: manifest of ");
		efs_fw_add_u64(t, s->manifest.n);
		efs_fw_add(t, " bytes, limit ");
		efs_fw_add_u64(t, EFS_FW_MAX_MANIFEST);
		return EFS_FW_E_COMMAND;
	}
	return EFS_FW_OK;
}

efs_fw_err efs_fw_parse(const efs_fw_port *port, const efs_port *root, const efs_envelope *env, efs_fw_step *s,
	efs_fw_text *t)
{
	body_fields bf = { { { NULL, 0 } }, { 0 }, 0, 0 };
	efs_fw_err e;

	memset(s, 0, sizeof *s);
	s->kind_name = env->kind;
	s->kind = kind_of(env->kind);
	efs_fw_add(t, "fwjob: bad command: ");
	if (s->kind == 0) {
		efs_fw_add(t, "unknown kind \"");
		efs_fw_add_bytes(t, env->kind);
		return bad(t, "\" (want one of [\"fw.begin\" \"fw.chunk\" \"fw.install\" \"fw.activate\" "
			"\"fw.commit\" \"fw.cancel\"])");
	}
	if (env->body.n == 0) {
		efs_fw_add_bytes(t, env->kind);
		return bad(t, " needs a body");
	}
	efs_fw_add_bytes(t, env->kind);
	if (read_body(env, s->kind, &bf, t) != 0) {
		return EFS_FW_E_COMMAND;
	}
	t->at = 27; /* after "check: fwjob: bad command: " */
	t->buf[t->at] = '\0';
	if (!(bf.present & 1u << F_JOB)) {
		return bad(t, "job missing");
	}
	s->job = bf.b[F_JOB];
	if (!job_ok(s->job)) {
		return bad(t, "job id must be 1 to 64 bytes of text without control characters");
	}
	s->image = bf.b[F_IMAGE];
	s->manifest = bf.b[F_MANIFEST];
	s->data = bf.b[F_DATA];
	s->size = bf.u[F_SIZE];
	s->version = bf.u[F_VERSION];
	s->chunk = bf.u[F_CHUNK];
	s->off = bf.u[F_OFF];
	if (s->kind != FW_BEGIN && s->kind != FW_CHUNK) {
		return EFS_FW_OK;
	}
	if ((e = bounds(port, &bf, s, t)) != EFS_FW_OK || s->kind != FW_BEGIN) {
		return e;
	}
	return efs_fw_manifest(port, root, s, t);
}
