/*
 * The admit rule (fence.Admit, fence.AdmitEpoch) and the ack's encoding (fence.MarshalAck:
 * core deterministic CBOR, integer keys in ascending order, shortest
 * integers, omitempty fields left out).
 */
#include <string.h>

#include "efs_internal.h"

efs_verdict efs_admit(efs_mark m, uint64_t t, uint64_t s, efs_mark *next)
{
	*next = m;
	if (t == 0 || s == 0) {
		return EFS_INVALID;
	}
	if (t > m.token || (t == m.token && s > m.seq)) {
		next->token = t;
		next->seq = s;
		return EFS_ACCEPTED;
	}
	return t < m.token ? EFS_STALE : EFS_DUPLICATE;
}

efs_verdict efs_admit_epoch(uint64_t e, efs_state cur, uint64_t epoch, uint64_t t, uint64_t s, efs_state *next)
{
	cur = efs_at(cur, e);
	*next = cur;
	if (t == 0 || s == 0 || epoch > cur.epoch) {
		return EFS_INVALID;
	}
	if (epoch < cur.epoch) {
		return EFS_STALE;
	}
	return efs_admit(cur.mark, t, s, &next->mark);
}

typedef struct {
	uint8_t *p;
	size_t cap;
	size_t n;
	int full;
} efs_wr;

static void put(efs_wr *w, const uint8_t *b, size_t n)
{
	if (w->full || w->cap - w->n < n) {
		w->full = 1;
		return;
	}
	if (n > 0) {
		memcpy(w->p + w->n, b, n);
	}
	w->n += n;
}

static void head(efs_wr *w, unsigned major, uint64_t v)
{
	uint8_t b[9];
	size_t n;

	if (v < 24) {
		b[0] = (uint8_t)(major << 5 | v);
		n = 1;
	} else if (v <= 0xff) {
		b[0] = (uint8_t)(major << 5 | 24);
		n = 2;
	} else if (v <= 0xffff) {
		b[0] = (uint8_t)(major << 5 | 25);
		n = 3;
	} else if (v <= 0xffffffffu) {
		b[0] = (uint8_t)(major << 5 | 26);
		n = 5;
	} else {
		b[0] = (uint8_t)(major << 5 | 27);
		n = 9;
	}
	for (size_t k = 1; k < n; k++) {
		b[k] = (uint8_t)(v >> (8 * (n - 1 - k)));
	}
	put(w, b, n);
}

static void text(efs_wr *w, efs_bytes s)
{
	head(w, 3, s.n);
	put(w, s.p, s.n);
}

efs_err efs_encode_ack(const efs_ack *a, uint8_t *out, size_t cap, size_t *n)
{
	efs_wr w = { out, cap, 0, 0 };
	unsigned pairs = 3;

	if (a->verdict < EFS_ACCEPTED || a->verdict > 6 || a->reason.n > EFS_MAX_REASON_LEN ||
		!efs_utf8_valid(a->reason.p, a->reason.n) ||
		(a->device.n != 0 && !efs_valid_device_id(a->device.p, a->device.n)) ||
		(a->id.n != 0 && !efs_valid_name(a->id.p, a->id.n, EFS_MAX_ID_LEN))) {
		return EFS_E_ACK;
	}
	pairs += (a->id.n != 0) + (a->token != 0) + (a->seq != 0) + (a->mark.token != 0) + (a->mark.seq != 0) +
		(a->reason.n != 0) + (a->epoch != 0);
	head(&w, 5, pairs);
	head(&w, 0, 1);
	head(&w, 0, EFS_VERSION);
	head(&w, 0, 2);
	text(&w, a->device);
	if (a->id.n != 0) {
		head(&w, 0, 3);
		text(&w, a->id);
	}
	head(&w, 0, 4);
	head(&w, 0, (uint64_t)a->verdict);
	if (a->token != 0) {
		head(&w, 0, 5);
		head(&w, 0, a->token);
	}
	if (a->seq != 0) {
		head(&w, 0, 6);
		head(&w, 0, a->seq);
	}
	if (a->mark.token != 0) {
		head(&w, 0, 7);
		head(&w, 0, a->mark.token);
	}
	if (a->mark.seq != 0) {
		head(&w, 0, 8);
		head(&w, 0, a->mark.seq);
	}
	if (a->reason.n != 0) {
		head(&w, 0, 9);
		text(&w, a->reason);
	}
	if (a->epoch != 0) {
		head(&w, 0, 10);
		head(&w, 0, a->epoch);
	}
	if (w.full) {
		return EFS_E_BUFFER;
	}
	*n = w.n;
	return EFS_OK;
}

const char *efs_strerror(efs_err e)
{
	static const char *const names[] = {
		"ok",
		"envelope too large",
		"truncated",
		"not well-formed CBOR",
		"indefinite length",
		"tag",
		"nested too deep",
		"array too long",
		"map too large",
		"text not UTF-8",
		"bytes after the envelope",
		"envelope is not a map",
		"unknown field",
		"duplicate map key",
		"field of the wrong type",
		"integer overflows its field",
		"wrong version",
		"token is 0",
		"seq is 0",
		"body too large",
		"holder too long",
		"authenticator present, but this fence point does not verify authenticators",
		"invalid device id",
		"invalid command id",
		"invalid kind",
		"body: invalid map key",
		"envelope names another device",
		"addressed device id invalid",
		"refused by the device's check",
		"mark not stored",
		"stored mark corrupt",
		"not a signed command (want COSE_Sign1, tag 18, array of 4)",
		"malformed signed command",
		"algorithm not accepted (want ES256)",
		"unknown signer key",
		"signer not authorised for this device",
		"bad signature",
		"buffer too small",
		"invalid ack",
		"malformed reset statement",
		"no operator root provisioned for resets",
		"reset for another device",
		"reset counter or epoch not above the device's (replay)",
		"unknown epoch",
	};
	if ((unsigned)e < sizeof names / sizeof names[0]) {
		return names[e];
	}
	return "unknown error";
}
