/*
 * The operator's authorised fence reset: fence/auth's reset statement and
 * devices/shim's reset in C. A reset is a COSE_Sign1 (tag 18) whose
 * protected header holds alg ES256 (1: -7), the root's kid (4) and the
 * content type (3) EFS_RESET_CONTENT, and nothing else; the unprotected
 * header is empty; the payload is the reset's map as fence/auth's trust
 * decoder reads it (integer keys 1 to 7, each at most once, no other key;
 * device and id text, token, seq, counter and epoch unsigned, issued a
 * signed 64-bit integer; null or undefined leave a field empty; no tags;
 * any head width, as Go's decoder). The Sig_structure is the signed
 * command's.
 */
#include <string.h>

#include "efs_internal.h"

static const char content[] = EFS_RESET_CONTENT;

/* str reads a definite byte (major 2) or text (3) string. */
static efs_err str(efs_rd *r, unsigned major, efs_bytes *out)
{
	efs_head h;

	if (efs_read_head(r, &h) != EFS_OK || h.major != major || h.arg > (uint64_t)(r->n - r->i)) {
		return EFS_E_RESET;
	}
	out->p = r->b + r->i;
	out->n = (size_t)h.arg;
	r->i += out->n;
	return EFS_OK;
}

/* header reads the protected header: alg ES256, a kid of 1 to 64 bytes and
 * a content type, each once, nothing else; *is_reset tells whether the
 * content type is a reset's. */
static efs_err header(efs_bytes p, efs_bytes *kid, int *is_reset)
{
	efs_rd r = { p.p, p.n, 0 };
	efs_head h, kh, vh;
	efs_bytes ct = { NULL, 0 };
	unsigned seen = 0;
	efs_err e = EFS_OK;

	kid->n = 0;
	*is_reset = 0;
	if (efs_read_head(&r, &h) != EFS_OK || h.major != 5 || h.arg > 16) {
		return EFS_E_RESET;
	}
	for (uint64_t k = 0; k < h.arg; k++) {
		if (efs_read_head(&r, &kh) != EFS_OK || kh.major != 0 || (kh.arg != 1 && kh.arg != 3 && kh.arg != 4) ||
			(seen & (1u << kh.arg))) {
			return EFS_E_RESET; /* only alg, content type and kid, once each */
		}
		seen |= 1u << kh.arg;
		if (kh.arg == 1) {
			if (efs_read_head(&r, &vh) != EFS_OK || vh.major > 1) {
				return EFS_E_RESET;
			}
			if (vh.major != 1 || vh.arg != 6) {
				e = EFS_E_ALG; /* -7: ES256; the structure is checked on */
			}
		} else if (kh.arg == 3) {
			if (str(&r, 3, &ct) != EFS_OK || ct.n == 0 || !efs_utf8_valid(ct.p, ct.n)) {
				return EFS_E_RESET;
			}
		} else if (str(&r, 2, kid) != EFS_OK || kid->n == 0 || kid->n > EFS_MAX_KEY_ID) {
			return EFS_E_RESET;
		}
	}
	if (r.i != r.n) {
		return EFS_E_RESET;
	}
	*is_reset = efs_bytes_equal(ct.p, ct.n, (const uint8_t *)content, sizeof content - 1);
	if (e == EFS_OK && !(seen & 2u)) {
		e = EFS_E_ALG;
	}
	if (e == EFS_OK && !(seen & 16u)) {
		e = EFS_E_RESET;
	}
	return e;
}

/* sign1 splits raw into its parts: tag, the four items, nothing after. */
static efs_err sign1(const uint8_t *raw, size_t n, efs_signed *s)
{
	efs_rd r = { raw, n, 2 };
	efs_head h;

	memset(s, 0, sizeof *s);
	if (n < 2 || raw[0] != 0xd2 || raw[1] != 0x84) {
		return EFS_E_UNSIGNED;
	}
	if (str(&r, 2, &s->protected_hdr) != EFS_OK || efs_read_head(&r, &h) != EFS_OK || h.major != 5 || h.arg != 0 ||
		str(&r, 2, &s->payload) != EFS_OK || str(&r, 2, &s->signature) != EFS_OK || r.i != n ||
		s->signature.n == 0) {
		return EFS_E_RESET;
	}
	return EFS_OK;
}

int efs_is_reset(const uint8_t *raw, size_t n)
{
	efs_signed s;
	efs_bytes kid;
	int is_reset = 0;

	if (n > EFS_MAX_SIGNED_SIZE || sign1(raw, n, &s) != EFS_OK) {
		return 0;
	}
	(void)header(s.protected_hdr, &kid, &is_reset);
	return is_reset;
}

/* field reads one of the reset's fields (key k) into rs. */
static efs_err field(efs_rd *r, uint64_t k, efs_reset *rs)
{
	efs_rd peek = *r;
	efs_head h;

	if (efs_read_head(&peek, &h) != EFS_OK) {
		return EFS_E_RESET;
	}
	if (h.major == 7 && (h.ai == 22 || h.ai == 23)) {
		r->i = peek.i; /* null, undefined: the field stays empty */
		return EFS_OK;
	}
	switch (k) {
	case 1:
	case 5:
		if (str(r, 3, k == 1 ? &rs->device : &rs->id) != EFS_OK) {
			return EFS_E_RESET;
		}
		return efs_utf8_valid(k == 1 ? rs->device.p : rs->id.p, k == 1 ? rs->device.n : rs->id.n) ? EFS_OK :
			EFS_E_RESET;
	case 6:
		if ((h.major != 0 && h.major != 1) || h.arg > (uint64_t)INT64_MAX) {
			return EFS_E_RESET;
		}
		rs->issued = h.major == 0 ? (int64_t)h.arg : -1 - (int64_t)h.arg;
		break;
	default:
		if (h.major != 0) {
			return EFS_E_RESET;
		}
		*(k == 2 ? &rs->token : k == 3 ? &rs->seq : k == 4 ? &rs->counter : &rs->epoch) = h.arg;
		break;
	}
	r->i = peek.i;
	return EFS_OK;
}

/* payload decodes the reset's map. */
static efs_err payload(efs_bytes p, efs_reset *rs)
{
	efs_rd r = { p.p, p.n, 0 };
	efs_head h, kh;
	unsigned seen = 0;

	memset(rs, 0, sizeof *rs);
	if (efs_read_head(&r, &h) != EFS_OK || h.major != 5 || h.arg > 16) {
		return EFS_E_RESET; /* null decodes to nothing: no reset either */
	}
	for (uint64_t k = 0; k < h.arg; k++) {
		if (efs_read_head(&r, &kh) != EFS_OK || kh.major != 0 || kh.arg < 1 || kh.arg > 7 ||
			(seen & (1u << kh.arg))) {
			return EFS_E_RESET; /* an unknown field, or one twice */
		}
		seen |= 1u << kh.arg;
		if (field(&r, kh.arg, rs) != EFS_OK) {
			return EFS_E_RESET;
		}
	}
	return r.i == r.n ? EFS_OK : EFS_E_RESET;
}

efs_err efs_decode_reset(const uint8_t *raw, size_t n, efs_signed *s, efs_reset *rs)
{
	int is_reset;
	efs_err e;

	memset(rs, 0, sizeof *rs);
	if (n > EFS_MAX_RESET_SIZE) {
		return EFS_E_RESET;
	}
	if ((e = sign1(raw, n, s)) != EFS_OK || (e = header(s->protected_hdr, &s->kid, &is_reset)) != EFS_OK) {
		return e; /* rs zero */
	}
	if (!is_reset) {
		return EFS_E_RESET;
	}
	if ((e = payload(s->payload, rs)) != EFS_OK) {
		memset(rs, 0, sizeof *rs);
	}
	return e;
}

/* valid_id is auth.ValidResetID. */
static int valid_id(efs_bytes id)
{
	static const char prefix[] = "reset:";

	if (id.n <= sizeof prefix - 1 || id.n > EFS_MAX_ID_LEN ||
		!efs_bytes_equal(id.p, sizeof prefix - 1, (const uint8_t *)prefix, sizeof prefix - 1)) {
		return 0;
	}
	for (size_t i = sizeof prefix - 1; i < id.n; i++) {
		uint8_t ch = id.p[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
			    ch == '_' || ch == '-')) {
			return 0;
		}
	}
	return 1;
}

efs_err efs_verify_reset(const efs_port *port, const uint8_t *raw, size_t n, const uint8_t *device, size_t device_len,
	efs_reset *rs)
{
	efs_signed s;
	uint8_t digest[32];
	efs_err e = efs_decode_reset(raw, n, &s, rs);

	if (e != EFS_OK) {
		return e;
	}
	if (port->sha256 == NULL || port->verify_root == NULL) {
		return EFS_E_NO_ROOT;
	}
	if ((e = efs_sig_digest(port, &s, digest)) != EFS_OK) {
		return e;
	}
	switch (port->verify_root(port->user, s.kid.p, s.kid.n, digest, s.signature.p)) {
	case EFS_PORT_OK:
		break;
	case EFS_PORT_UNKNOWN_KEY:
		return EFS_E_UNKNOWN_KEY;
	default:
		return EFS_E_BAD_SIGNATURE;
	}
	if (!efs_valid_device_id(rs->device.p, rs->device.n) || rs->token == 0 || rs->seq == 0 || rs->counter == 0 ||
		rs->epoch == 0 || !valid_id(rs->id)) {
		return EFS_E_RESET;
	}
	if (!efs_bytes_equal(rs->device.p, rs->device.n, device, device_len)) {
		return EFS_E_RESET_DEVICE;
	}
	return EFS_OK;
}

/* refuse answers a reset not applied: Invalid, the state unchanged, the ack
 * naming the reset it claims to be (auth.ResetAck with PeekReset's). */
static void refuse(efs_result *r, efs_err e, const efs_reset *claimed)
{
	size_t at = 0;

	r->verdict = EFS_INVALID;
	r->err = e;
	efs_text_add(r->reason, sizeof r->reason, &at,
		e == EFS_E_UNKNOWN_KEY ? "reset signed by a key that is not the operator root" : efs_strerror(e));
	if (claimed != NULL && valid_id(claimed->id)) {
		r->decoded = 1;
		r->env.id = claimed->id;
		r->env.token = claimed->token;
		r->env.seq = claimed->seq;
	}
}

void efs_reset_process(efs_ctx *c, const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n,
	efs_result *r, efs_err blocked)
{
	efs_reset rs, claim;
	efs_signed s;
	efs_bytes holder = { (const uint8_t *)"operator reset", 14 };
	efs_err e;
	size_t at = 0;
	efs_mark m;

	memset(r, 0, sizeof *r);
	r->reset = 1;
	(void)efs_decode_reset(buf, n, &s, &claim); /* zero if it does not decode: claims nothing */
	if (!efs_valid_device_id(device, device_len)) {
		refuse(r, EFS_E_ADDRESSED, &claim);
		return;
	}
	if (!c->corrupt) {
		efs_state_now(c, r); /* fence.CheckReset's epoch, and the refusal's ack */
	}
	r->device.p = device;
	r->device.n = device_len;
	if ((e = efs_verify_reset(c->port, buf, n, device, device_len, &rs)) != EFS_OK) {
		refuse(r, e, &claim);
		return;
	}
	if (c->corrupt || blocked != EFS_OK) {
		refuse(r, c->corrupt ? EFS_E_CORRUPT : blocked, &rs);
		return;
	}
	if (rs.counter <= c->reset_counter || rs.epoch <= r->epoch) {
		refuse(r, EFS_E_RESET_REPLAY, &rs);
		return;
	}
	m.token = rs.token;
	m.seq = rs.seq;
	if (efs_store_reset(c, &m, rs.epoch, &holder, &rs.id, &rs) != EFS_OK) {
		efs_state_now(c, r);
		refuse(r, EFS_E_STORAGE, &rs);
		return;
	}
	r->verdict = EFS_ACCEPTED;
	r->mark = c->mark;
	r->epoch = c->epoch;
	r->decoded = 1;
	r->env.id = rs.id;
	r->env.token = rs.token;
	r->env.seq = rs.seq;
	efs_text_add(r->reason, sizeof r->reason, &at, "fence reset to ");
	efs_text_u64(r->reason, sizeof r->reason, &at, rs.token);
	efs_text_add(r->reason, sizeof r->reason, &at, "/");
	efs_text_u64(r->reason, sizeof r->reason, &at, rs.seq);
}

void efs_handle(efs_ctx *c, const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n, efs_result *r)
{
	if (efs_is_reset(buf, n)) { /* the operator's reset, not a command */
		efs_reset_process(c, device, device_len, buf, n, r, EFS_OK);
		return;
	}
	efs_process(c, device, device_len, buf, n, r);
}
