/*
 * Signed commands: fence/auth's Verify in C. A command is a COSE_Sign1
 * (RFC 9052), tagged, whose payload is the envelope: 0xd2 0x84, then the
 * protected header as a byte string holding a map of exactly alg (1) =
 * ES256 (-7) and kid (4) = 1 to 64 bytes, in any order and any integer
 * width (as go-cose decodes them), the unprotected header an empty map,
 * the payload a byte string (not null: no detached payloads), and the
 * signature a non-empty byte string, and nothing after it. The signature
 * covers the Sig_structure ["Signature1", protected, h'', payload] in
 * deterministic encoding, the protected header's own bytes as received.
 */
#include <string.h>

#include "efs_internal.h"

/* bstr reads a definite byte string. */
static efs_err bstr(efs_rd *r, efs_bytes *out)
{
	efs_head h;
	efs_err e = efs_read_head(r, &h);

	if (e != EFS_OK) {
		return e == EFS_E_TRUNCATED ? e : EFS_E_COSE;
	}
	if (h.major != 2) {
		return EFS_E_COSE;
	}
	if (h.arg > (uint64_t)(r->n - r->i)) {
		return EFS_E_TRUNCATED;
	}
	out->p = r->b + r->i;
	out->n = (size_t)h.arg;
	r->i += out->n;
	return EFS_OK;
}

/* protected_hdr checks the protected header map and finds the kid. */
static efs_err protected_hdr(efs_bytes p, efs_bytes *kid)
{
	efs_rd r = { p.p, p.n, 0 };
	efs_head h;
	int alg = 0;

	if (efs_read_head(&r, &h) != EFS_OK || h.major != 5) {
		return EFS_E_COSE;
	}
	kid->n = 0;
	for (uint64_t k = 0; k < h.arg; k++) {
		efs_head kh, vh;
		if (efs_read_head(&r, &kh) != EFS_OK || kh.major != 0 || (kh.arg != 1 && kh.arg != 4)) {
			return EFS_E_COSE; /* only alg and kid: not critical headers, content types, ... */
		}
		if ((kh.arg == 1 && alg) || (kh.arg == 4 && kid->n != 0)) {
			return EFS_E_COSE; /* a duplicate label */
		}
		if (kh.arg == 1) {
			if (efs_read_head(&r, &vh) != EFS_OK || vh.major != 1) {
				return EFS_E_ALG;
			}
			if (vh.arg != 6) {
				return EFS_E_ALG; /* -7: ES256 */
			}
			alg = 1;
			continue;
		}
		if (bstr(&r, kid) != EFS_OK || kid->n == 0 || kid->n > EFS_MAX_KEY_ID) {
			return EFS_E_COSE;
		}
	}
	if (r.i != r.n) {
		return EFS_E_COSE;
	}
	if (!alg) {
		return EFS_E_ALG;
	}
	return kid->n == 0 ? EFS_E_COSE : EFS_OK;
}

efs_err efs_decode_signed(const uint8_t *raw, size_t n, efs_signed *s, efs_envelope *env)
{
	efs_rd r = { raw, n, 2 };
	efs_head h;
	efs_err e;

	memset(s, 0, sizeof *s);
	memset(env, 0, sizeof *env);
	if (n > EFS_MAX_SIGNED_SIZE) {
		return EFS_E_TOO_LARGE;
	}
	if (n < 2 || raw[0] != 0xd2 || raw[1] != 0x84) {
		return EFS_E_UNSIGNED;
	}
	if ((e = bstr(&r, &s->protected_hdr)) != EFS_OK) {
		return e;
	}
	if ((e = efs_read_head(&r, &h)) != EFS_OK || h.major != 5 || h.arg != 0) {
		return e == EFS_E_TRUNCATED ? e : EFS_E_COSE; /* unprotected: empty */
	}
	if ((e = bstr(&r, &s->payload)) != EFS_OK || (e = bstr(&r, &s->signature)) != EFS_OK) {
		return e; /* null (a detached payload) is not a byte string */
	}
	if (r.i != n || s->signature.n == 0) {
		return EFS_E_COSE;
	}
	if ((e = protected_hdr(s->protected_hdr, &s->kid)) != EFS_OK) {
		return e;
	}
	return efs_decode_envelope(s->payload.p, s->payload.n, env);
}

size_t efs_bstr_head(uint8_t *p, size_t len)
{
	size_t w = len < 24 ? 0 : len <= 0xff ? 1 : len <= 0xffff ? 2 : len <= 0xffffffffu ? 4 : 8;

	p[0] = (uint8_t)(0x40 | (w == 0 ? len : w == 1 ? 24 : w == 2 ? 25 : w == 4 ? 26 : 27));
	for (size_t k = 0; k < w; k++) {
		p[1 + k] = (uint8_t)((uint64_t)len >> (8 * (w - 1 - k)));
	}
	return 1 + w;
}

/* efs_sig_digest hashes s's Sig_structure with port.sha256, in place:
 * five slices, no copy of the payload. */
efs_err efs_sig_digest(const efs_port *port, const efs_signed *s, uint8_t digest[32])
{
	static const uint8_t context[] = { 0x84, 0x6a, 'S', 'i', 'g', 'n', 'a', 't', 'u', 'r', 'e', '1' };
	uint8_t phead[9], mid[10];
	efs_bytes parts[5];

	mid[0] = 0x40; /* external_aad: empty */
	parts[0].p = context;
	parts[0].n = sizeof context;
	parts[1].p = phead;
	parts[1].n = efs_bstr_head(phead, s->protected_hdr.n);
	parts[2] = s->protected_hdr;
	parts[3].p = mid;
	parts[3].n = 1 + efs_bstr_head(mid + 1, s->payload.n);
	parts[4] = s->payload;
	if (port->sha256(port->user, parts, 5, digest) != 0 || s->signature.n != 64) {
		return EFS_E_BAD_SIGNATURE;
	}
	return EFS_OK;
}

efs_err efs_verify_signed(const efs_port *port, const uint8_t *raw, size_t n, efs_signed *s, efs_envelope *env)
{
	uint8_t digest[32];
	efs_err e = efs_decode_signed(raw, n, s, env);

	if (e != EFS_OK) {
		return e;
	}
	if (port->sha256 == NULL || port->verify == NULL) {
		return EFS_E_UNKNOWN_KEY;
	}
	if ((e = efs_sig_digest(port, s, digest)) != EFS_OK) {
		return e;
	}
	switch (port->verify(port->user, s->kid.p, s->kid.n, env->device.p, env->device.n, digest, s->signature.p)) {
	case EFS_PORT_OK:
		return EFS_OK;
	case EFS_PORT_UNKNOWN_KEY:
		return EFS_E_UNKNOWN_KEY;
	case EFS_PORT_NOT_AUTHORISED:
		return EFS_E_NOT_AUTHORISED;
	default:
		return EFS_E_BAD_SIGNATURE;
	}
}
