/*
 * The deterministic CBOR subset's decoder rules, as fxamacker/cbor applies
 * them with package fence's decoding options: definite lengths only, no
 * tags, at most EFS_MAX_NESTING nested arrays and maps, at most
 * EFS_MAX_ARRAY_ELEMS elements and EFS_MAX_MAP_PAIRS pairs, text strings
 * valid UTF-8 (as Go's utf8.Valid), well-formed simple values. Like Go, it
 * accepts integers and lengths not in their shortest form and map keys in
 * any order.
 *
 * For a body (keys set) it adds what decoding the body into a Go `any`
 * refuses: a map key that is an array, a map or a negative integer below
 * -2^63, and two keys of one map that decode to equal Go values (integers by
 * value whatever their encoding, strings by bytes, floats of any width by
 * value with -0 == 0 and NaN equal to nothing, null == undefined).
 */

#include "efs_internal.h"

efs_err efs_read_head(efs_rd *r, efs_head *h)
{
	uint8_t ib;
	size_t len, k;
	uint64_t v = 0;

	if (r->i >= r->n) {
		return EFS_E_TRUNCATED;
	}
	ib = r->b[r->i++];
	h->major = ib >> 5;
	h->ai = ib & 0x1fu;
	if (h->ai < 24) {
		h->arg = h->ai;
		return EFS_OK;
	}
	if (h->ai == 31) {
		return (h->major >= 2 && h->major <= 5) ? EFS_E_INDEFINITE : EFS_E_MALFORMED;
	}
	if (h->ai > 27) {
		return EFS_E_MALFORMED;
	}
	len = (size_t)1 << (h->ai - 24);
	if (r->n - r->i < len) {
		return EFS_E_TRUNCATED;
	}
	for (k = 0; k < len; k++) {
		v = (v << 8) | r->b[r->i++];
	}
	h->arg = v;
	if (h->major == 7 && h->ai == 24 && v < 32) {
		return EFS_E_MALFORMED;
	}
	return EFS_OK;
}

int efs_bytes_equal(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
	if (an != bn) {
		return 0;
	}
	for (size_t i = 0; i < an; i++) {
		if (a[i] != b[i]) {
			return 0;
		}
	}
	return 1;
}

int efs_utf8_valid(const uint8_t *p, size_t n)
{
	size_t i = 0;

	while (i < n) {
		uint8_t c = p[i];
		size_t need;
		uint8_t lo = 0x80, hi = 0xbf;

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			need = 1;
		} else if (c >= 0xe0 && c <= 0xef) {
			need = 2;
			if (c == 0xe0) {
				lo = 0xa0;
			} else if (c == 0xed) {
				hi = 0x9f; /* no surrogates */
			}
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3;
			if (c == 0xf0) {
				lo = 0x90;
			} else if (c == 0xf4) {
				hi = 0x8f;
			}
		} else {
			return 0;
		}
		if (n - i - 1 < need) {
			return 0;
		}
		if (p[i + 1] < lo || p[i + 1] > hi) {
			return 0;
		}
		for (size_t k = 2; k <= need; k++) {
			if (p[i + k] < 0x80 || p[i + k] > 0xbf) {
				return 0;
			}
		}
		i += need + 1;
	}
	return 1;
}

/* Key classes: how a body map key decodes into a Go `any`. */
enum { K_UINT, K_NEG, K_BYTES, K_TEXT, K_BOOL, K_NIL, K_SIMPLE, K_FLOAT };

typedef struct {
	int cls;
	uint64_t v;     /* integer, bool, simple value, or a float's binary64 bits */
	efs_bytes s;    /* string bytes */
} efs_key;

/* half and single floats widened to binary64 bits, exactly, without
 * floating point arithmetic (no soft-float on an FPU-less core). */
static uint64_t widen(uint64_t bits, int expbits, int mantbits)
{
	uint64_t sign = bits >> (expbits + mantbits);
	uint64_t e = (bits >> mantbits) & ((1u << expbits) - 1u);
	uint64_t m = bits & (((uint64_t)1 << mantbits) - 1u);
	int bias = (1 << (expbits - 1)) - 1;
	int64_t exp;

	if (e == ((1u << expbits) - 1u)) { /* inf, NaN */
		return (sign << 63) | ((uint64_t)0x7ff << 52) | (m << (52 - mantbits));
	}
	if (e == 0) {
		if (m == 0) {
			return sign << 63;
		}
		exp = 1 - bias;
		while (!(m & ((uint64_t)1 << mantbits))) { /* normalise a subnormal */
			m <<= 1;
			exp--;
		}
		m &= ((uint64_t)1 << mantbits) - 1u;
	} else {
		exp = (int64_t)e - bias;
	}
	return (sign << 63) | ((uint64_t)(exp + 1023) << 52) | (m << (52 - mantbits));
}

static EFS_NOINLINE efs_err key_of(const efs_rd *r, size_t start, efs_key *k)
{
	efs_rd t = { r->b, r->n, start };
	efs_head h;
	efs_err e = efs_read_head(&t, &h);

	if (e != EFS_OK) {
		return e;
	}
	k->v = h.arg;
	k->s.p = NULL;
	k->s.n = 0;
	switch (h.major) {
	case 0:
		k->cls = K_UINT;
		return EFS_OK;
	case 1:
		if (h.arg > (uint64_t)INT64_MAX) {
			return EFS_E_BODY_KEY; /* a big.Int: not a map key */
		}
		k->cls = K_NEG;
		return EFS_OK;
	case 2:
	case 3:
		k->cls = h.major == 2 ? K_BYTES : K_TEXT;
		k->s.p = t.b + t.i;
		k->s.n = (size_t)h.arg;
		return EFS_OK;
	case 7:
		break;
	default:
		return EFS_E_BODY_KEY; /* arrays and maps (tags never get here) */
	}
	switch (h.ai) {
	case 20:
	case 21:
		k->cls = K_BOOL;
		return EFS_OK;
	case 22:
	case 23:
		k->cls = K_NIL;
		k->v = 0;
		return EFS_OK;
	case 25:
		k->cls = K_FLOAT;
		k->v = widen(h.arg, 5, 10);
		return EFS_OK;
	case 26:
		k->cls = K_FLOAT;
		k->v = widen(h.arg, 8, 23);
		return EFS_OK;
	case 27:
		k->cls = K_FLOAT;
		return EFS_OK;
	default:
		k->cls = K_SIMPLE;
		return EFS_OK;
	}
}

static int is_nan(uint64_t b)
{
	return ((b >> 52) & 0x7ffu) == 0x7ffu && (b & (((uint64_t)1 << 52) - 1u)) != 0;
}

static int key_equal(const efs_key *a, const efs_key *b)
{
	if (a->cls != b->cls) {
		return 0;
	}
	switch (a->cls) {
	case K_BYTES:
	case K_TEXT:
		return efs_bytes_equal(a->s.p, a->s.n, b->s.p, b->s.n);
	case K_NIL:
		return 1;
	case K_FLOAT:
		if (is_nan(a->v) || is_nan(b->v)) {
			return 0;
		}
		if (((a->v | b->v) << 1) == 0) {
			return 1; /* -0 == +0 */
		}
		return a->v == b->v;
	default:
		return a->v == b->v;
	}
}

/* dup_before reports whether the key at kpos equals a key before it in the
 * map whose first key is at first (the map already walked up to kpos). */
static EFS_NOINLINE efs_err dup_before(const efs_rd *r, size_t first, size_t kpos)
{
	efs_key k, o;
	efs_rd t = { r->b, r->n, first };
	efs_err e = key_of(r, kpos, &k);

	if (e != EFS_OK) {
		return e;
	}
	while (t.i < kpos) {
		e = key_of(&t, t.i, &o);
		if (e != EFS_OK) {
			return e;
		}
		if (key_equal(&k, &o)) {
			return EFS_E_DUP_KEY;
		}
		if ((e = efs_skip(&t, 2)) != EFS_OK) { /* the key and its value */
			return e;
		}
	}
	return EFS_OK;
}

/* step_string steps over a string's bytes, checking that they are in the
 * input and, for text, UTF-8. */
static efs_err step_string(efs_rd *r, const efs_head *h, int text)
{
	if (h->arg > (uint64_t)(r->n - r->i)) {
		return EFS_E_TRUNCATED;
	}
	if (text && !efs_utf8_valid(r->b + r->i, (size_t)h->arg)) {
		return EFS_E_UTF8;
	}
	r->i += (size_t)h->arg;
	return EFS_OK;
}

efs_err efs_skip(efs_rd *r, uint64_t items)
{
	efs_head h;

	while (items > 0) {
		efs_err e = efs_read_head(r, &h);
		items--;
		if (e != EFS_OK) {
			return e;
		}
		switch (h.major) {
		case 2:
		case 3:
			if ((e = step_string(r, &h, 0)) != EFS_OK) {
				return e;
			}
			break;
		case 4:
			items += h.arg; /* at most EFS_MAX_ARRAY_ELEMS: walked before */
			break;
		case 5:
			items += 2 * h.arg;
			break;
		default:
			break;
		}
	}
	return EFS_OK;
}

/* efs_walk walks one item without recursion: an explicit stack holds the
 * open arrays and maps (EFS_MAX_NESTING at most), each with the items it
 * has left and, for a map, where its first key is (for the key check). */
efs_err efs_walk(efs_rd *r, unsigned depth, int keys)
{
	struct {
		size_t first;  /* a map's first key */
		uint16_t left; /* items left: elements, or keys and values */
		uint8_t map;
	} st[EFS_MAX_NESTING];
	unsigned top = 0; /* open containers */

	do {
		size_t pos = r->i, first = 0;
		int is_key = 0;
		efs_head h;
		efs_err e;

		if (top > 0) {
			is_key = st[top - 1].map && st[top - 1].left % 2 == 0;
			first = st[top - 1].first;
			st[top - 1].left--;
		}
		if ((e = efs_read_head(r, &h)) != EFS_OK) {
			return e;
		}
		switch (h.major) {
		case 2:
		case 3:
			if ((e = step_string(r, &h, h.major == 3)) != EFS_OK) {
				return e;
			}
			break;
		case 4:
		case 5:
			if (depth + top + 1 > EFS_MAX_NESTING) {
				return EFS_E_NESTING;
			}
			if (h.major == 4 && h.arg > EFS_MAX_ARRAY_ELEMS) {
				return EFS_E_ARRAY_ELEMS;
			}
			if (h.major == 5 && h.arg > EFS_MAX_MAP_PAIRS) {
				return EFS_E_MAP_PAIRS;
			}
			st[top].first = r->i;
			st[top].left = (uint16_t)(h.major == 5 ? 2 * h.arg : h.arg);
			st[top].map = h.major == 5;
			top++;
			break;
		case 6:
			return EFS_E_TAG;
		default:
			break;
		}
		if (keys && is_key && (e = dup_before(r, first, pos)) != EFS_OK) {
			return e;
		}
		while (top > 0 && st[top - 1].left == 0) {
			top--;
		}
	} while (top > 0);
	return EFS_OK;
}
