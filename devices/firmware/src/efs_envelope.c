/*
 * The envelope decoder: fence.UnmarshalEnvelope in C. First the whole input
 * is checked as one well-formed item under the decoder's rules (as
 * fxamacker/cbor does before it decodes), then the top map is decoded into
 * the envelope's fields the way Go decodes it into the struct: keys are
 * unsigned integers naming a field (in any order, any width; anything else
 * is an unknown field), each field at most once, null and undefined leave a
 * field empty (but a body of null is the one-byte item null), integers must
 * fit their field. Then Envelope.Validate's checks, in its order.
 */
#include <string.h>

#include "efs_internal.h"

enum { F_V = 1, F_DEVICE, F_TOKEN, F_SEQ, F_ID, F_KIND, F_BODY, F_ISSUED, F_HOLDER, F_EPOCH, F_AUTH = 15 };

static int is_nil(const efs_head *h)
{
	return h->major == 7 && (h->ai == 22 || h->ai == 23);
}

/* value_head reads a field's head: EFS_OK with *nil set for null and
 * undefined, which leave a field empty as in Go. */
static efs_err value_head(efs_rd *r, efs_head *h, int *nil)
{
	efs_err e = efs_read_head(r, h);

	*nil = e == EFS_OK && is_nil(h);
	return e;
}

static efs_err field_uint(efs_rd *r, uint64_t max, uint64_t *out)
{
	efs_head h;
	int nil;
	efs_err e = value_head(r, &h, &nil);

	*out = 0;
	if (e != EFS_OK || nil) {
		return e;
	}
	if (h.major != 0) {
		return EFS_E_TYPE;
	}
	if (h.arg > max) {
		return EFS_E_OVERFLOW;
	}
	*out = h.arg;
	return EFS_OK;
}

static efs_err field_int(efs_rd *r, int64_t *out)
{
	efs_head h;
	int nil;
	efs_err e = value_head(r, &h, &nil);

	*out = 0;
	if (e != EFS_OK || nil) {
		return e;
	}
	if (h.major != 0 && h.major != 1) {
		return EFS_E_TYPE;
	}
	if (h.arg > (uint64_t)INT64_MAX) {
		return EFS_E_OVERFLOW;
	}
	*out = h.major == 0 ? (int64_t)h.arg : -1 - (int64_t)h.arg;
	return EFS_OK;
}

/* field_str reads a text (major 3) or byte (major 2) string. */
static efs_err field_str(efs_rd *r, unsigned major, efs_bytes *out)
{
	efs_head h;
	int nil;
	efs_err e = value_head(r, &h, &nil);

	out->p = r->b + r->i;
	out->n = 0;
	if (e != EFS_OK || nil) {
		return e;
	}
	if (h.major != major) {
		return EFS_E_TYPE;
	}
	out->n = (size_t)h.arg; /* in bounds: the walk checked it */
	r->i += out->n;
	return EFS_OK;
}

/* field_auth reads the authenticator: a byte string, or, as Go decodes
 * into a []byte, an array of byte values; only an empty one is valid here,
 * so a non-empty array is refused whatever it holds. */
static efs_err field_auth(efs_rd *r, efs_envelope *env)
{
	size_t start = r->i;
	efs_head h;
	efs_err e = efs_read_head(r, &h);

	if (e != EFS_OK) {
		return e;
	}
	if (h.major != 4) {
		r->i = start;
		return field_str(r, 2, &env->auth);
	}
	env->auth.p = r->b + start;
	env->auth.n = 0;
	return h.arg == 0 ? EFS_OK : EFS_E_AUTH;
}

static efs_err field(efs_rd *r, uint64_t key, efs_envelope *env)
{
	uint64_t u;
	size_t start;
	efs_err e;

	switch (key) {
	case F_V:
		e = field_uint(r, 255, &u);
		env->v = (uint8_t)u;
		return e;
	case F_DEVICE:
		return field_str(r, 3, &env->device);
	case F_TOKEN:
		return field_uint(r, UINT64_MAX, &env->token);
	case F_SEQ:
		return field_uint(r, UINT64_MAX, &env->seq);
	case F_ID:
		return field_str(r, 3, &env->id);
	case F_KIND:
		return field_str(r, 3, &env->kind);
	case F_BODY:
		start = r->i;
		e = efs_skip(r, 1);
		env->body.p = r->b + start;
		env->body.n = r->i - start;
		return e;
	case F_ISSUED:
		return field_int(r, &env->issued_at);
	case F_HOLDER:
		return field_str(r, 3, &env->holder);
	case F_EPOCH:
		return field_uint(r, UINT64_MAX, &env->epoch);
	case F_AUTH:
		return field_auth(r, env);
	default:
		return EFS_E_UNKNOWN_FIELD;
	}
}

static int name_byte(uint8_t c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
		c == '_' || c == '-';
}

/* efs_valid_device_id is fence.ValidateDeviceID. */
int efs_valid_device_id(const uint8_t *p, size_t n)
{
	if (n == 0 || n > EFS_MAX_DEVICE_ID_LEN || p[0] == '.') {
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (!name_byte(p[i])) {
			return 0;
		}
	}
	return 1;
}

/* efs_valid_name is fence's validateName. */
int efs_valid_name(const uint8_t *p, size_t n, size_t max)
{
	if (n == 0 || n > max) {
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (!name_byte(p[i]) && p[i] != ':' && p[i] != '/') {
			return 0;
		}
	}
	return 1;
}

/* validate is Envelope.Validate. */
static efs_err validate(const efs_envelope *env)
{
	efs_rd r;
	efs_err e;

	if (env->v != EFS_VERSION) {
		return EFS_E_VERSION;
	}
	if (env->token == 0) {
		return EFS_E_TOKEN_ZERO;
	}
	if (env->seq == 0) {
		return EFS_E_SEQ_ZERO;
	}
	if (env->body.n > EFS_MAX_BODY_SIZE) {
		return EFS_E_BODY_SIZE;
	}
	if (env->holder.n > EFS_MAX_HOLDER_LEN) {
		return EFS_E_HOLDER; /* UTF-8: the walk checked every text string */
	}
	if (env->auth.n != 0) {
		return EFS_E_AUTH;
	}
	if (!efs_valid_device_id(env->device.p, env->device.n)) {
		return EFS_E_DEVICE_ID;
	}
	if (!efs_valid_name(env->id.p, env->id.n, EFS_MAX_ID_LEN)) {
		return EFS_E_ID;
	}
	if (!efs_valid_name(env->kind.p, env->kind.n, EFS_MAX_KIND_LEN)) {
		return EFS_E_KIND;
	}
	if (env->body.n == 0) {
		return EFS_OK;
	}
	/* The body on its own, as validateBody decodes it into a Go any. */
	r.b = env->body.p;
	r.n = env->body.n;
	r.i = 0;
	e = efs_walk(&r, 1, 1);
	return e == EFS_OK && r.i != r.n ? EFS_E_TRAILING : e;
}

efs_err efs_decode_envelope(const uint8_t *buf, size_t n, efs_envelope *env)
{
	efs_rd r = { buf, n, 0 };
	efs_head h;
	efs_err e;
	uint32_t seen = 0;

	memset(env, 0, sizeof *env);
	if (n > EFS_MAX_ENVELOPE_SIZE) {
		return EFS_E_TOO_LARGE;
	}
	if ((e = efs_walk(&r, 0, 0)) != EFS_OK) {
		return e;
	}
	if (r.i != n) {
		return EFS_E_TRAILING;
	}
	r.i = 0;
	if ((e = efs_read_head(&r, &h)) != EFS_OK) {
		return e;
	}
	if (is_nil(&h)) {
		return EFS_E_VERSION; /* Go leaves the struct zero */
	}
	if (h.major != 5) {
		return EFS_E_NOT_MAP;
	}
	for (uint64_t k = 0; k < h.arg; k++) {
		efs_head kh;
		if ((e = efs_read_head(&r, &kh)) != EFS_OK) {
			return e;
		}
		if (kh.major != 0 || kh.arg > F_AUTH || (kh.arg > F_EPOCH && kh.arg < F_AUTH) || kh.arg == 0) {
			return EFS_E_UNKNOWN_FIELD;
		}
		if (seen & ((uint32_t)1 << kh.arg)) {
			return EFS_E_DUP_KEY;
		}
		seen |= (uint32_t)1 << kh.arg;
		if ((e = field(&r, kh.arg, env)) != EFS_OK) {
			return e;
		}
	}
	return validate(env);
}
