/*
 * thermostat.c: efsdev's device model, devices/sim's Thermostat in C (set,
 * twin.set and ping; setpoint, mode, relay), and its state journal.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "efsdev.h"

const char *const efsdev_modes[4] = {"off", "heat", "cool", "auto"};

/* A CBOR head: major type, argument, and where the item's content starts. */
typedef struct {
	const uint8_t *p, *end;
} rd;

static int head(rd *r, int *major, int *ai, uint64_t *arg)
{
	int k, n;

	if (r->p >= r->end) {
		return -1;
	}
	*major = *r->p >> 5;
	*ai = *r->p & 31;
	r->p++;
	if (*ai < 24) {
		*arg = (uint64_t)*ai;
		return 0;
	}
	if (*ai > 27) {
		return -1;
	}
	n = 1 << (*ai - 24);
	if (r->end - r->p < n) {
		return -1;
	}
	*arg = 0;
	for (k = 0; k < n; k++) {
		*arg = *arg << 8 | *r->p++;
	}
	return 0;
}

static double half(uint16_t h)
{
	int e = (h >> 10) & 0x1f;
	double m = h & 0x3ff, v;

	if (e == 0) {
		v = ldexp(m, -24);
	} else if (e == 31) {
		v = m == 0 ? INFINITY : NAN;
	} else {
		v = ldexp(m + 1024, e - 25);
	}
	return (h & 0x8000) ? -v : v;
}

/* number reads an integer or a float; 1 for null or undefined (left unset). */
static int number(rd *r, double *v)
{
	int major, ai;
	uint64_t a;
	float f;
	uint32_t u32;

	if (head(r, &major, &ai, &a) != 0) {
		return -1;
	}
	switch (major) {
	case 0:
		*v = (double)a;
		return 0;
	case 1:
		*v = -1.0 - (double)a;
		return 0;
	case 7:
		break;
	default:
		return -1;
	}
	switch (ai) {
	case 22:
	case 23:
		return 1;
	case 25:
		*v = half((uint16_t)a);
		return 0;
	case 26:
		u32 = (uint32_t)a;
		memcpy(&f, &u32, 4);
		*v = f;
		return 0;
	case 27:
		memcpy(v, &a, 8);
		return 0;
	}
	return -1;
}

static int field(rd *r, const char *name, efsdev_changes *c, const char **reason)
{
	int major, ai, k;
	uint64_t a;

	if (strcmp(name, "setpoint") == 0) {
		int rc = number(r, &c->setpoint);
		if (rc < 0) {
			*reason = "sim: bad command: setpoint is not a number";
			return -1;
		}
		c->has_setpoint = rc == 0;
		if (c->has_setpoint && (isnan(c->setpoint) || c->setpoint < -50.0 || c->setpoint > 150.0)) {
			*reason = "sim: bad command: setpoint outside -50..150";
			return -1;
		}
		return 0;
	}
	if (head(r, &major, &ai, &a) != 0) {
		return -1;
	}
	if (major == 7 && (ai == 22 || ai == 23)) {
		return 0; /* null: unchanged */
	}
	if (strcmp(name, "relay") == 0) {
		if (major != 7 || (ai != 20 && ai != 21)) {
			*reason = "sim: bad command: relay is not a bool";
			return -1;
		}
		c->has_relay = 1;
		c->relay = ai == 21;
		return 0;
	}
	if (major != 3 || a > (uint64_t)(r->end - r->p)) {
		*reason = "sim: bad command: mode is not a text";
		return -1;
	}
	for (k = 0; k < 4; k++) {
		if (strlen(efsdev_modes[k]) == a && memcmp(efsdev_modes[k], r->p, a) == 0) {
			r->p += a;
			c->has_mode = 1;
			c->mode = (uint8_t)k;
			return 0;
		}
	}
	*reason = "sim: bad command: mode not one of [off heat cool auto]";
	return -1;
}

/* body reads a set or twin.set body: a map naming only setpoint, mode and
 * relay (the library has refused duplicate keys already). */
static int body(efs_bytes b, efsdev_changes *c, const char **reason)
{
	rd r = {b.p, b.p + b.n};
	int major, ai;
	uint64_t pairs, a, i;
	char name[9];

	if (head(&r, &major, &ai, &pairs) != 0 || major != 5) {
		*reason = "sim: bad command: body is not a map";
		return -1;
	}
	for (i = 0; i < pairs; i++) {
		if (head(&r, &major, &ai, &a) != 0 || major != 3 || a > (uint64_t)(r.end - r.p)) {
			*reason = "sim: bad command: body key is not a text";
			return -1;
		}
		if (a >= sizeof name) {
			*reason = "sim: bad command: unknown field (a thermostat has [setpoint mode relay])";
			return -1;
		}
		memcpy(name, r.p, a);
		name[a] = '\0';
		r.p += a;
		if (strcmp(name, "setpoint") != 0 && strcmp(name, "mode") != 0 && strcmp(name, "relay") != 0) {
			*reason = "sim: bad command: unknown field (a thermostat has [setpoint mode relay])";
			return -1;
		}
		if (field(&r, name, c, reason) != 0) {
			if (*reason == NULL) {
				*reason = "sim: bad command: body";
			}
			return -1;
		}
	}
	if (!c->has_setpoint && !c->has_mode && !c->has_relay) {
		*reason = "sim: bad command: set changes nothing (want setpoint, mode or relay)";
		return -1;
	}
	return 0;
}

static int kind_is(const efs_envelope *env, const char *k)
{
	return env->kind.n == strlen(k) && memcmp(env->kind.p, k, env->kind.n) == 0;
}

int efsdev_parse(const efs_envelope *env, efsdev_changes *c, const char **reason)
{
	memset(c, 0, sizeof *c);
	*reason = NULL;
	if (kind_is(env, "ping")) {
		if (env->body.n == 0 || (env->body.n == 1 && env->body.p[0] == 0xf6)) {
			return 0;
		}
		*reason = "sim: bad command: ping takes no body";
		return -1;
	}
	if (!kind_is(env, "set") && !kind_is(env, "twin.set")) {
		*reason = "sim: bad command: unknown kind (want \"set\", \"twin.set\" or \"ping\")";
		return -1;
	}
	if (env->body.n == 0) {
		*reason = "sim: bad command: set needs a body";
		return -1;
	}
	return body(env->body, c, reason);
}

void efsdev_apply(efsdev_state *s, const efsdev_changes *c, uint64_t token, uint64_t seq, efs_bytes id)
{
	if (c->has_setpoint) {
		s->setpoint = c->setpoint;
	}
	if (c->has_mode) {
		s->mode = c->mode;
	}
	if (c->has_relay) {
		s->relay = c->relay;
	}
	s->applied++;
	s->last_token = token;
	s->last_seq = seq;
	s->last_id_len = (uint8_t)(id.n < EFS_MAX_ID_LEN ? id.n : EFS_MAX_ID_LEN);
	memcpy(s->last_id, id.p, s->last_id_len);
}

/* The journal's slots: magic, generation, the record, CRC-32C of them. */
#define SLOT 512u
#define MAGIC 0x45465344u /* "EFSD" */

typedef char rec_fits[sizeof(efsdev_journal_rec) + 12 <= SLOT ? 1 : -1];

static int read_slot(int fd, unsigned i, uint32_t *gen, efsdev_journal_rec *rec, int *blank)
{
	uint8_t b[SLOT];
	uint32_t magic, crc;
	size_t n = sizeof *rec;
	ssize_t got = pread(fd, b, SLOT, (off_t)i * SLOT);
	size_t k;

	*blank = 1;
	for (k = 0; got > 0 && k < (size_t)got; k++) {
		if (b[k] != 0) {
			*blank = 0;
		}
	}
	if (got != (ssize_t)SLOT) {
		return -1;
	}
	memcpy(&magic, b, 4);
	memcpy(gen, b + 4, 4);
	memcpy(&crc, b + 8 + n, 4);
	if (magic != MAGIC || crc != efs_crc32c(b, 8 + n)) {
		return -1;
	}
	memcpy(rec, b + 8, n);
	return 0;
}

int efsdev_journal_open(efsdev_journal *j, const char *path)
{
	efsdev_journal_rec r[2];
	uint32_t g[2];
	int ok[2], blank[2];
	unsigned i;

	memset(j, 0, sizeof *j);
	j->rec.state.setpoint = 20;
	j->rec.state.mode = EFSDEV_MODE_OFF;
	j->fd = open(path, O_RDWR | O_CREAT, 0600);
	if (j->fd < 0) {
		return -1;
	}
	for (i = 0; i < 2; i++) {
		ok[i] = read_slot(j->fd, i, &g[i], &r[i], &blank[i]) == 0;
	}
	if (!ok[0] && !ok[1]) {
		if (blank[0] && blank[1]) {
			return 0; /* new */
		}
		errno = EILSEQ;
		return -1; /* records, none valid: fail closed */
	}
	i = ok[0] && (!ok[1] || g[0] > g[1]) ? 0 : 1;
	j->gen = g[i];
	j->rec = r[i];
	return 0;
}

/* efsdev_journal_write writes j->rec as generation gen+1 to the slot not
 * holding the newest record, then fdatasyncs. */
int efsdev_journal_write(efsdev_journal *j)
{
	uint8_t b[SLOT];
	uint32_t magic = MAGIC, gen = j->gen + 1, crc;
	size_t n = sizeof j->rec;

	memset(b, 0, sizeof b);
	memcpy(b, &magic, 4);
	memcpy(b + 4, &gen, 4);
	memcpy(b + 8, &j->rec, n);
	crc = efs_crc32c(b, 8 + n);
	memcpy(b + 8 + n, &crc, 4);
	if (pwrite(j->fd, b, SLOT, (off_t)(gen % 2) * SLOT) != (ssize_t)SLOT || fdatasync(j->fd) != 0) {
		return -1;
	}
	j->gen = gen;
	return 0;
}

/* CBOR writer for the state report. */
static size_t put_head(uint8_t *o, int major, uint64_t v)
{
	int n, k;

	if (v < 24) {
		o[0] = (uint8_t)(major << 5 | (int)v);
		return 1;
	}
	n = v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffu ? 4 : 8;
	o[0] = (uint8_t)(major << 5 | (n == 1 ? 24 : n == 2 ? 25 : n == 4 ? 26 : 27));
	for (k = 0; k < n; k++) {
		o[1 + k] = (uint8_t)(v >> (8 * (n - 1 - k)));
	}
	return (size_t)n + 1;
}

static size_t put_text(uint8_t *o, const char *s, size_t n)
{
	size_t h = put_head(o, 3, n);

	memcpy(o + h, s, n);
	return h + n;
}

static size_t put_key(uint8_t *o, const char *k) { return put_text(o, k, strlen(k)); }

size_t efsdev_state_cbor(const efsdev_state *s, uint8_t *o, size_t cap)
{
	size_t n = 0;
	float f = (float)s->setpoint;
	uint64_t bits;
	uint32_t b32;
	int k;

	if (cap < 256) {
		return 0;
	}
	/* keys in the deterministic order: shorter first, then bytewise */
	o[n++] = 0xa7;
	n += put_key(o + n, "mode");
	n += put_key(o + n, efsdev_modes[s->mode & 3]);
	n += put_key(o + n, "relay");
	o[n++] = s->relay ? 0xf5 : 0xf4;
	n += put_key(o + n, "applied");
	n += put_head(o + n, 0, s->applied);
	n += put_key(o + n, "last_id");
	n += put_text(o + n, s->last_id, s->last_id_len);
	n += put_key(o + n, "last_seq");
	n += put_head(o + n, 0, s->last_seq);
	n += put_key(o + n, "setpoint");
	if ((double)f == s->setpoint) {
		memcpy(&b32, &f, 4);
		bits = b32;
		o[n++] = 0xfa;
		k = 4;
	} else {
		memcpy(&bits, &s->setpoint, 8);
		o[n++] = 0xfb;
		k = 8;
	}
	while (k-- > 0) {
		o[n++] = (uint8_t)(bits >> (8 * k));
	}
	n += put_key(o + n, "last_token");
	n += put_head(o + n, 0, s->last_token);
	return n;
}

void efsdev_json_string(char *out, size_t cap, size_t *at, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	size_t i;

	if (*at + 2 * n * 6 + 3 > cap) {
		n = 0; /* never for the fields efsdev logs (at most 256 bytes) */
	}
	out[(*at)++] = '"';
	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\') {
			out[(*at)++] = '\\';
			out[(*at)++] = (char)c;
		} else if (c < 0x20) {
			memcpy(out + *at, "\\u00", 4);
			*at += 4;
			out[(*at)++] = hex[c >> 4];
			out[(*at)++] = hex[c & 15];
		} else {
			out[(*at)++] = (char)c;
		}
	}
	out[(*at)++] = '"';
	out[*at] = '\0';
}
