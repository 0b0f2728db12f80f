/*
 * efsdev's trust (invariant I7, fence/auth), on Debian's mbedTLS
 * (libmbedcrypto): the key store behind the library's port.verify, and the
 * device key that signs its acks and state reports.
 *
 * The store holds the operator's root public key (--trust-root, PKIX PEM,
 * and its kid), the gateway certificates the root signed, the newest
 * revocation list and the newest epoch statement (the fleet's epoch:
 * fence/auth's {1: epoch >= 1, 2: issued}, at most 1 KiB; the library's
 * port.epoch). Certificates come from files at start (--certs) and over
 * the air: a trust update (auth.MarshalUpdate: a CBOR array of 1 to 8 byte
 * strings, first byte 0x81..0x88) on the device's cmd topic, which the
 * agent sends before a device's first command. Each statement is checked
 * against the root (COSE_Sign1, ES256, the root's kid, content type
 * ContentCertificate, ContentRevocations or ContentEpoch); one that is not
 * the root's refuses the whole update. A certificate replaces the one held
 * for its kid only with a higher serial; a list only with a higher
 * version; an epoch statement only with a higher epoch. What an update
 * changes is written to <dir>/trust.cbor (a CBOR sequence of the
 * statements held, written to a temporary file, fdatasync, rename, fsync
 * of the directory) before it takes effect, and read back at start, so a
 * restart keeps the certificates learned, the newest list (a replayed
 * older list cannot un-revoke) and the newest epoch (it only goes up).
 *
 * A lookup (Trust.Key) refuses an unknown kid, a revoked one, a device key
 * (role 1), a certificate not valid now (the Linux device has a clock) and
 * one that does not name the device (an id, "prefix*" or "*").
 *
 * Signing (auth.Signer.signContent): COSE_Sign1, tag 18, protected
 * {1: -7, 3: content type, 4: kid}, unprotected {}, the payload, and the
 * signature r || s over the Sig_structure, ES256 deterministic (RFC 6979)
 * with mbedTLS's blinding.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecdsa.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>
#include <mbedtls/sha256.h>

#include "efsdev.h"

static const char content_cert[] = "application/edgefence-cert+cbor";
static const char content_revocations[] = "application/edgefence-revocations+cbor";
static const char content_epoch[] = "application/edgefence-epoch+cbor";

/* What a statement is: its slot in the store. */
enum { STMT_CERT, STMT_LIST, STMT_EPOCH };

#define MAX_EPOCH_SIZE 1024u /* auth.MaxEpochSize */

/* A reader over a buffer: definite lengths only (fence/auth forbids
 * indefinite ones in statements). */
typedef struct {
	const uint8_t *b;
	size_t n, i;
} rd;

static int head(rd *r, unsigned *major, uint64_t *arg)
{
	unsigned ai, k, len;

	if (r->i >= r->n) {
		return -1;
	}
	*major = r->b[r->i] >> 5;
	ai = r->b[r->i] & 0x1f;
	r->i++;
	if (ai < 24) {
		*arg = ai;
		return 0;
	}
	if (ai > 27) {
		return -1; /* indefinite or reserved */
	}
	len = 1u << (ai - 24);
	if (r->n - r->i < len) {
		return -1;
	}
	*arg = 0;
	for (k = 0; k < len; k++) {
		*arg = *arg << 8 | r->b[r->i++];
	}
	return 0;
}

/* str reads a byte string (major 2) or text (3) into *p, *len. */
static int str(rd *r, unsigned want, const uint8_t **p, size_t *len)
{
	unsigned m;
	uint64_t a;

	if (head(r, &m, &a) != 0 || m != want || a > r->n - r->i) {
		return -1;
	}
	*p = r->b + r->i;
	*len = (size_t)a;
	r->i += (size_t)a;
	return 0;
}

/* integer reads a CBOR integer that fits int64. */
static int integer(rd *r, int64_t *v)
{
	unsigned m;
	uint64_t a;

	if (head(r, &m, &a) != 0 || (m != 0 && m != 1) || a > INT64_MAX) {
		return -1;
	}
	*v = m == 0 ? (int64_t)a : -1 - (int64_t)a;
	return 0;
}

/* uinteger reads an unsigned integer (major 0), any width. */
static int uinteger(rd *r, uint64_t *v)
{
	unsigned m;

	return head(r, &m, v) == 0 && m == 0 ? 0 : -1;
}

/* null_field steps over a field's null or undefined: Go's decoder leaves
 * the field empty (its zero value), as if it were absent but for the
 * field's once-only rule; 1 if it did. */
static int null_field(rd *r)
{
	if (r->i < r->n && (r->b[r->i] == 0xf6 || r->b[r->i] == 0xf7)) {
		r->i++;
		return 1;
	}
	return 0;
}

/* The library's own checks (efs_cbor.c), the same rules as Go's. */
int efs_utf8_valid(const uint8_t *p, size_t n);
int efs_valid_device_id(const uint8_t *p, size_t n);

/* strings checks an array of text (3: UTF-8) or byte (2) strings, at least
 * one; its length in *count, the first one's in *first. */
static int strings_of(rd *r, unsigned major, uint64_t *count, const uint8_t **first, size_t *first_n)
{
	unsigned m;
	uint64_t k;

	if (head(r, &m, count) != 0 || m != 4 || *count > 4096) {
		return -1;
	}
	for (k = 0; k < *count; k++) {
		const uint8_t *p;
		size_t pn;
		if (str(r, major, &p, &pn) != 0 || (major == 3 && !efs_utf8_valid(p, pn))) {
			return -1;
		}
		if (k == 0) {
			*first = p;
			*first_n = pn;
		}
	}
	return 0;
}

static int bytes_eq(const uint8_t *a, size_t an, const void *b, size_t bn)
{
	return an == bn && (an == 0 || memcmp(a, b, an) == 0);
}

/* A COSE_Sign1's parts (fence/auth's decodeSign1, for statements and what
 * we sign). */
typedef struct {
	const uint8_t *prot, *kid, *ctype, *payload, *sig;
	size_t prot_n, kid_n, ctype_n, payload_n, sig_n;
} sign1;

static int parse_protected(sign1 *s)
{
	rd r = {s->prot, s->prot_n, 0};
	unsigned m;
	uint64_t n, k;
	int have_alg = 0;

	if (head(&r, &m, &n) != 0 || m != 5) {
		return -1;
	}
	for (k = 0; k < n; k++) {
		int64_t label, alg;
		if (integer(&r, &label) != 0) {
			return -1;
		}
		if (label == 1 && !have_alg && integer(&r, &alg) == 0 && alg == -7) {
			have_alg = 1;
		} else if (label == 3 && s->ctype == NULL && str(&r, 3, &s->ctype, &s->ctype_n) == 0) {
		} else if (label == 4 && s->kid == NULL && str(&r, 2, &s->kid, &s->kid_n) == 0) {
		} else {
			return -1; /* another label, a duplicate, or a value of the wrong type */
		}
	}
	return have_alg && s->kid != NULL && s->kid_n >= 1 && s->kid_n <= EFS_MAX_KEY_ID && r.i == r.n ? 0 : -1;
}

static int parse_sign1(const uint8_t *raw, size_t n, sign1 *s)
{
	rd r = {raw, n, 0};
	unsigned m;
	uint64_t a;

	memset(s, 0, sizeof *s);
	if (n < 3 || raw[0] != 0xd2 || raw[1] != 0x84) {
		return -1;
	}
	r.i = 2;
	if (str(&r, 2, &s->prot, &s->prot_n) != 0 || head(&r, &m, &a) != 0 || m != 5 || a != 0 ||
	    str(&r, 2, &s->payload, &s->payload_n) != 0 || str(&r, 2, &s->sig, &s->sig_n) != 0 || r.i != n ||
	    s->sig_n != 64) {
		return -1; /* the unprotected header empty, in any head width (as go-cose) */
	}
	return parse_protected(s);
}

/* bstr_head writes a byte string's shortest head for n to h; its length. */
static size_t bstr_head(uint8_t *h, size_t n, unsigned major)
{
	uint8_t m = (uint8_t)(major << 5);

	if (n < 24) {
		h[0] = m | (uint8_t)n;
		return 1;
	}
	if (n < 256) {
		h[0] = m | 24;
		h[1] = (uint8_t)n;
		return 2;
	}
	if (n < 65536) {
		h[0] = m | 25;
		h[1] = (uint8_t)(n >> 8);
		h[2] = (uint8_t)n;
		return 3;
	}
	h[0] = m | 26;
	h[1] = (uint8_t)(n >> 24);
	h[2] = (uint8_t)(n >> 16);
	h[3] = (uint8_t)(n >> 8);
	h[4] = (uint8_t)n;
	return 5;
}

/* sig_digest hashes the Sig_structure ["Signature1", prot, h'', payload]. */
static int sig_digest(const uint8_t *prot, size_t pn, const uint8_t *payload, size_t n, uint8_t digest[32])
{
	static const uint8_t start[] = {0x84, 0x6a, 'S', 'i', 'g', 'n', 'a', 't', 'u', 'r', 'e', '1'};
	uint8_t h1[5], h2[5], empty = 0x40;
	size_t l1 = bstr_head(h1, pn, 2), l2 = bstr_head(h2, n, 2);
	efs_bytes parts[6];

	parts[0].p = start;
	parts[0].n = sizeof start;
	parts[1].p = h1;
	parts[1].n = l1;
	parts[2].p = prot;
	parts[2].n = pn;
	parts[3].p = &empty;
	parts[3].n = 1;
	parts[4].p = h2;
	parts[4].n = l2;
	parts[5].p = payload;
	parts[5].n = n;
	return efsdev_sha256(NULL, parts, 6, digest);
}

int efsdev_sha256(void *user, const efs_bytes *parts, size_t n, uint8_t digest[32])
{
	mbedtls_sha256_context h;
	int ret;
	size_t i;

	(void)user;
	mbedtls_sha256_init(&h);
	ret = mbedtls_sha256_starts_ret(&h, 0);
	for (i = 0; ret == 0 && i < n; i++) {
		ret = mbedtls_sha256_update_ret(&h, parts[i].p, parts[i].n);
	}
	if (ret == 0) {
		ret = mbedtls_sha256_finish_ret(&h, digest);
	}
	mbedtls_sha256_free(&h);
	return ret;
}

/* load_point reads q (0x04 || X || Y) as a P-256 public key into k, which
 * must then be freed; -1 for a point off the curve (as Go's
 * ecdsa.ParseUncompressedPublicKey). The key keeps its group, so mbedTLS
 * caches its tables there between verifies. */
static int load_point(mbedtls_ecp_keypair *k, const uint8_t q[65])
{
	mbedtls_ecp_keypair_init(k);
	if (mbedtls_ecp_group_load(&k->grp, MBEDTLS_ECP_DP_SECP256R1) != 0 || mbedtls_ecp_point_read_binary(&k->grp, &k->Q, q, 65) != 0 ||
	    mbedtls_ecp_check_pubkey(&k->grp, &k->Q) != 0) {
		mbedtls_ecp_keypair_free(k);
		return -1;
	}
	return 0;
}

/* es256_verify checks sig (r || s) over digest with k (mbedTLS 2.28 takes
 * the group mutable: it may cache tables in it). */
static int es256_verify(mbedtls_ecp_keypair *k, const uint8_t digest[32], const uint8_t sig[64])
{
	mbedtls_mpi r, s;
	int ret;

	mbedtls_mpi_init(&r);
	mbedtls_mpi_init(&s);
	ret = mbedtls_mpi_read_binary(&r, sig, 32);
	if (ret == 0) {
		ret = mbedtls_mpi_read_binary(&s, sig + 32, 32);
	}
	if (ret == 0) {
		ret = mbedtls_ecdsa_verify(&k->grp, digest, 32, &k->Q, &r, &s);
	}
	mbedtls_mpi_free(&s);
	mbedtls_mpi_free(&r);
	return ret;
}

/* cose_key reads an EC2 P-256 COSE_Key {1: 2, -1: 1, -2: x, -3: y} into q. */
static int cose_key(rd *r, uint8_t q[65])
{
	unsigned m;
	uint64_t n, k;
	int64_t kty = 0, crv = 0;
	const uint8_t *x = NULL, *y = NULL;
	size_t xn = 0, yn = 0;

	if (head(r, &m, &n) != 0 || m != 5 || n != 4) {
		return -1;
	}
	for (k = 0; k < n; k++) {
		int64_t label;
		if (integer(r, &label) != 0) {
			return -1;
		}
		if ((label == 1 && integer(r, &kty) != 0) || (label == -1 && integer(r, &crv) != 0) ||
		    (label == -2 && str(r, 2, &x, &xn) != 0) || (label == -3 && str(r, 2, &y, &yn) != 0) ||
		    (label != 1 && label != -1 && label != -2 && label != -3)) {
			return -1;
		}
	}
	if (kty != 2 || crv != 1 || x == NULL || y == NULL || xn != 32 || yn != 32) {
		return -1;
	}
	q[0] = 0x04;
	memcpy(q + 1, x, 32);
	memcpy(q + 33, y, 32);
	return 0;
}

/* parse_cert decodes a verified certificate's payload (auth.Certificate). */
static int parse_cert(const uint8_t *p, size_t n, efsdev_cert *c)
{
	rd r = {p, n, 0};
	unsigned m;
	uint64_t pairs, k, seen = 0;
	const uint8_t *dev = NULL;
	size_t dev_n = 0;

	memset(c, 0, sizeof *c);
	if (head(&r, &m, &pairs) != 0 || m != 5 || pairs > 7) {
		return -1;
	}
	for (k = 0; k < pairs; k++) {
		int64_t label, v;
		const uint8_t *kid;
		if (integer(&r, &label) != 0 || label < 1 || label > 7 || (seen & (1u << label))) {
			return -1;
		}
		seen |= 1u << label;
		if (null_field(&r)) {
			continue; /* empty: kid, key and devices are then refused below, as Go's Validate */
		}
		switch (label) {
		case 1:
			if (str(&r, 2, &kid, &c->kid_len) != 0 || c->kid_len < 1 || c->kid_len > EFS_MAX_KEY_ID) {
				return -1;
			}
			memcpy(c->kid, kid, c->kid_len);
			break;
		case 2:
			if (cose_key(&r, c->q) != 0) {
				return -1;
			}
			break;
		case 3:
			c->devices_off = r.i;
			if (strings_of(&r, 3, &c->ndevices, &dev, &dev_n) != 0 || c->ndevices == 0) {
				return -1; /* []string: text only */
			}
			break;
		case 6:
			if (uinteger(&r, &c->serial) != 0) {
				return -1; /* uint64 */
			}
			break;
		default:
			if (integer(&r, &v) != 0) {
				return -1;
			}
			if (label == 4) {
				c->not_before = v;
			} else if (label == 5) {
				c->not_after = v;
			} else {
				c->role = v;
			}
		}
	}
	if ((seen & 0x7e) != 0x7e || c->not_after <= c->not_before || r.i != n || c->kid_len == 0 || c->q[0] != 0x04 ||
		c->ndevices == 0) {
		return -1;
	}
	/* Role.check: a gateway's (0), or a device's (1) naming exactly one
	 * device, by its id */
	if (c->role != 0 && (c->role != 1 || c->ndevices != 1 || (dev_n > 0 && dev[dev_n - 1] == '*') ||
		!efs_valid_device_id(dev, dev_n))) {
		return -1;
	}
	return 0;
}

/* parse_revocations decodes a verified list (auth.Revocations): its version
 * and where its key ids are. */
static int parse_revocations(const uint8_t *p, size_t n, uint64_t *version, size_t *kids_off)
{
	rd r = {p, n, 0};
	unsigned m;
	uint64_t pairs, k, count;
	int64_t v;
	const uint8_t *first;
	size_t first_n;
	unsigned seen = 0;

	*kids_off = 0;
	*version = 0;
	if (head(&r, &m, &pairs) != 0 || m != 5 || pairs > 3) {
		return -1;
	}
	for (k = 0; k < pairs; k++) {
		int64_t label;
		if (integer(&r, &label) != 0 || label < 1 || label > 3 || (seen & (1u << label))) {
			return -1; /* an unknown field, or one twice */
		}
		seen |= 1u << label;
		if (null_field(&r)) {
			continue; /* empty: version 0, no key ids, issued 0, as Go's decoder */
		}
		if (label == 1) {
			if (uinteger(&r, version) != 0) {
				return -1; /* uint64 */
			}
		} else if (label == 2) {
			*kids_off = r.i;
			if (strings_of(&r, 2, &count, &first, &first_n) != 0) {
				return -1; /* [][]byte: byte strings only */
			}
		} else if (integer(&r, &v) != 0) { /* 3: issued */
			return -1;
		}
	}
	return r.i == n ? 0 : -1;
}

/* parse_epoch decodes a verified epoch statement's payload (auth.Epoch):
 * 1 epoch (uint64, at least 1), 2 issued (int64), each at most once, no
 * other field; null leaves a field empty, as Go's decoder. */
static int parse_epoch(const uint8_t *p, size_t n, uint64_t *epoch)
{
	rd r = {p, n, 0};
	unsigned m, seen = 0;
	uint64_t pairs, k;
	int64_t v;

	*epoch = 0;
	if (head(&r, &m, &pairs) != 0 || m != 5 || pairs > 2) {
		return -1;
	}
	for (k = 0; k < pairs; k++) {
		int64_t label;
		if (integer(&r, &label) != 0 || label < 1 || label > 2 || (seen & (1u << label))) {
			return -1; /* an unknown field, or one twice */
		}
		seen |= 1u << label;
		if (null_field(&r)) {
			continue;
		}
		if (label == 1 ? uinteger(&r, epoch) != 0 : integer(&r, &v) != 0) {
			return -1;
		}
	}
	return r.i == n && *epoch != 0 ? 0 : -1; /* Epoch.Validate: epochs start at 1 */
}

/* open_statement checks raw against the root and returns its parts. */
static int open_statement(efsdev_trust *t, const uint8_t *raw, size_t n, sign1 *s, const char **why)
{
	uint8_t digest[32];

	if (n > EFSDEV_MAX_STATEMENT || parse_sign1(raw, n, s) != 0 || s->ctype == NULL) {
		*why = "malformed trust statement";
		return -1;
	}
	if (!bytes_eq(s->kid, s->kid_n, t->root_kid, strlen(t->root_kid))) {
		*why = "trust statement not signed by the root";
		return -1;
	}
	if (sig_digest(s->prot, s->prot_n, s->payload, s->payload_n, digest) != 0 || es256_verify(&t->root_key, digest, s->sig) != 0) {
		*why = "trust statement: bad signature";
		return -1;
	}
	return 0;
}

static uint8_t *dup_bytes(const uint8_t *p, size_t n)
{
	uint8_t *d = malloc(n > 0 ? n : 1);

	if (d != NULL) {
		memcpy(d, p, n);
	}
	return d;
}

/* statement_kind checks one statement and says what adopting it would do:
 * 1 new (or newer), 0 held or older (skipped), -1 refused; *kind is its
 * slot, *version its rank (a list's version, an epoch's number). */
static int statement_kind(efsdev_trust *t, const uint8_t *raw, size_t n, efsdev_cert *c, int *kind,
	uint64_t *version, const char **why)
{
	sign1 s;
	size_t kids_off;
	int i;

	if (open_statement(t, raw, n, &s, why) != 0) {
		return -1;
	}
	if (bytes_eq(s.ctype, s.ctype_n, content_revocations, strlen(content_revocations))) {
		*kind = STMT_LIST;
		if (parse_revocations(s.payload, s.payload_n, version, &kids_off) != 0) {
			*why = "malformed revocation list";
			return -1;
		}
		return *version > t->rev_version ? 1 : 0;
	}
	if (bytes_eq(s.ctype, s.ctype_n, content_epoch, strlen(content_epoch))) {
		*kind = STMT_EPOCH;
		if (n > MAX_EPOCH_SIZE || parse_epoch(s.payload, s.payload_n, version) != 0) {
			*why = "malformed epoch statement";
			return -1;
		}
		return *version > t->epoch ? 1 : 0;
	}
	*kind = STMT_CERT;
	if (!bytes_eq(s.ctype, s.ctype_n, content_cert, strlen(content_cert)) || parse_cert(s.payload, s.payload_n, c) != 0 ||
	    load_point(&c->pub, c->q) != 0) {
		*why = "malformed certificate";
		return -1;
	}
	mbedtls_ecp_keypair_free(&c->pub); /* adopt loads it again for the one kept */
	for (i = 0; i < t->ncerts; i++) {
		if (bytes_eq(t->certs[i].kid, t->certs[i].kid_len, c->kid, c->kid_len)) {
			return c->serial > t->certs[i].serial ? 1 : 0;
		}
	}
	return 1;
}

/* adopt_epoch keeps copy, an epoch statement of epoch, in the epoch's
 * slot. */
static void adopt_epoch(efsdev_trust *t, uint8_t *copy, size_t n, uint64_t epoch)
{
	free(t->epoch_raw);
	t->epoch_raw = copy;
	t->epoch_n = n;
	t->epoch = epoch;
}

/* adopt keeps a checked statement (a copy of raw) if it is newer than the
 * one held in its slot: 1 adopted, 0 held, -1 out of memory or room. */
static int adopt(efsdev_trust *t, const uint8_t *raw, size_t n, efsdev_cert *c, int kind, uint64_t version)
{
	sign1 s;
	uint8_t *copy;
	int i, slot = t->ncerts, is_list = kind == STMT_LIST;

	if ((is_list && version <= t->rev_version) || (kind == STMT_EPOCH && version <= t->epoch)) {
		return 0;
	}
	if (kind == STMT_EPOCH) {
		if ((copy = dup_bytes(raw, n)) == NULL) {
			return -1;
		}
		adopt_epoch(t, copy, n, version);
		return 1;
	}
	for (i = 0; !is_list && i < t->ncerts; i++) {
		if (bytes_eq(t->certs[i].kid, t->certs[i].kid_len, c->kid, c->kid_len)) {
			if (c->serial <= t->certs[i].serial) {
				return 0;
			}
			slot = i;
		}
	}
	if (!is_list && slot == EFSDEV_MAX_CERTS) {
		return -1;
	}
	if ((copy = dup_bytes(raw, n)) == NULL || parse_sign1(copy, n, &s) != 0 || (!is_list && load_point(&c->pub, c->q) != 0)) {
		free(copy);
		return -1;
	}
	if (is_list) {
		free(t->rev_raw);
		t->rev_raw = copy;
		t->rev_n = n;
		parse_revocations(s.payload, s.payload_n, &t->rev_version, &t->rev_kids_off);
		t->rev_payload = s.payload;
		t->rev_payload_n = s.payload_n;
		return 1;
	}
	c->raw = copy;
	c->raw_n = n;
	c->payload = s.payload;
	c->payload_n = s.payload_n;
	if (slot < t->ncerts) {
		free(t->certs[slot].raw);
		mbedtls_ecp_keypair_free(&t->certs[slot].pub);
	} else {
		t->ncerts++;
	}
	t->certs[slot] = *c;
	return 1;
}

/* save writes every statement held to t->path (a CBOR sequence of byte
 * strings): temporary file, fdatasync, rename, fsync of the directory. */
static int save(const efsdev_trust *t)
{
	char tmp[4200], dir[4200];
	uint8_t h[5];
	int fd, ok = 1, i;
	size_t hn;
	char *slash;

	if (t->path[0] == '\0') {
		return 0;
	}
	snprintf(tmp, sizeof tmp, "%s.tmp", t->path);
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) {
		return -1;
	}
	for (i = 0; ok && i <= t->ncerts + 1; i++) { /* the certificates, the list, the epoch statement */
		const uint8_t *p = i < t->ncerts ? t->certs[i].raw : i == t->ncerts ? t->rev_raw : t->epoch_raw;
		size_t n = i < t->ncerts ? t->certs[i].raw_n : i == t->ncerts ? t->rev_n : t->epoch_n;
		if (p == NULL) {
			continue;
		}
		hn = bstr_head(h, n, 2);
		ok = write(fd, h, hn) == (ssize_t)hn && write(fd, p, n) == (ssize_t)n;
	}
	ok = ok && fdatasync(fd) == 0;
	ok = close(fd) == 0 && ok;
	if (!ok || rename(tmp, t->path) != 0) {
		unlink(tmp);
		return -1;
	}
	snprintf(dir, sizeof dir, "%s", t->path);
	if ((slash = strrchr(dir, '/')) != NULL) {
		*slash = '\0';
		if ((fd = open(dir, O_RDONLY)) >= 0) {
			ok = fsync(fd) == 0;
			close(fd);
		}
	}
	return ok ? 0 : -1;
}

int efsdev_trust_update(efsdev_trust *t, const uint8_t *raw, size_t n, int persist, efsdev_trust_counts *out,
	const char **why)
{
	rd r = {raw, n, 0};
	unsigned m;
	uint64_t count, k;
	const uint8_t *st[EFSDEV_MAX_UPDATE];
	size_t sn[EFSDEV_MAX_UPDATE];
	efsdev_cert certs[EFSDEV_MAX_UPDATE];
	uint64_t versions[EFSDEV_MAX_UPDATE];
	int kinds[EFSDEV_MAX_UPDATE], changed = 0;

	memset(out, 0, sizeof *out);
	if (n > EFSDEV_MAX_UPDATE_SIZE || n == 0 || raw[0] < 0x81 || raw[0] > 0x88 || head(&r, &m, &count) != 0) {
		*why = "malformed trust update"; /* auth.IsUpdate: the array's head in one byte */
		return -1;
	}
	for (k = 0; k < count; k++) {
		size_t at = r.i;
		uint8_t h[5];
		if (str(&r, 2, &st[k], &sn[k]) != 0 || sn[k] == 0 || sn[k] > EFSDEV_MAX_STATEMENT ||
		    (size_t)(st[k] - raw) - at != bstr_head(h, sn[k], 2)) {
			*why = "malformed trust update statement"; /* auth.ParseUpdate: shortest length heads */
			return -1;
		}
	}
	if (r.i != n) {
		*why = "bytes after the trust update";
		return -1;
	}
	/* every statement must be the root's, or the update changes nothing */
	for (k = 0; k < count; k++) {
		if (statement_kind(t, st[k], sn[k], &certs[k], &kinds[k], &versions[k], why) < 0) {
			return -1;
		}
	}
	/* adopt in memory those newer than held, save, and only then answer */
	for (k = 0; k < count; k++) {
		int rc = adopt(t, st[k], sn[k], &certs[k], kinds[k], versions[k]);
		if (rc < 0) {
			*why = "trust store full";
			return -1;
		}
		out->applied += rc;
		out->held += 1 - rc;
		changed |= rc;
	}
	if (changed && persist && save(t) != 0) {
		*why = "trust store not written";
		return -2;
	}
	return 0;
}

int efsdev_trust_file(efsdev_trust *t, const char *path, int sequence, const char **why)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long size;
	size_t at = 0;
	int rc = 0;

	*why = "cannot read";
	if (f == NULL) {
		return -1;
	}
	if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || size > (long)EFSDEV_MAX_UPDATE_SIZE * 64 ||
	    fseek(f, 0, SEEK_SET) != 0 || (buf = malloc((size_t)size + 1)) == NULL) {
		fclose(f);
		return -1;
	}
	if (fread(buf, 1, (size_t)size, f) != (size_t)size || (!sequence && size == 0)) {
		rc = -1; /* unreadable, or an empty statement file */
	}
	fclose(f);
	/* a statement file is one statement; the store's file a sequence of
	 * byte strings, each taken as a one-statement update */
	while (rc == 0 && at < (size_t)size) {
		uint8_t one[EFSDEV_MAX_STATEMENT + 8];
		size_t n = (size_t)size - at, hn;
		efsdev_trust_counts c;
		if (sequence) {
			rd r = {buf + at, (size_t)size - at, 0};
			const uint8_t *p;
			if (str(&r, 2, &p, &n) != 0 || n > EFSDEV_MAX_STATEMENT) {
				*why = "malformed trust store";
				rc = -1;
				break;
			}
			at += r.i - n;
		} else if (n > EFSDEV_MAX_STATEMENT) {
			*why = "statement too large";
			rc = -1;
			break;
		}
		one[0] = 0x81;
		hn = bstr_head(one + 1, n, 2);
		memcpy(one + 1 + hn, buf + at, n);
		rc = efsdev_trust_update(t, one, 1 + hn + n, 0, &c, why) == 0 ? 0 : -1;
		at += n;
	}
	free(buf);
	return rc;
}

int efsdev_trust_epoch_file(efsdev_trust *t, const char *path, const char **why)
{
	uint8_t raw[MAX_EPOCH_SIZE + 1], one[MAX_EPOCH_SIZE + 8];
	FILE *f = fopen(path, "rb");
	size_t n = f != NULL ? fread(raw, 1, sizeof raw, f) : 0, hn;
	efsdev_trust_counts c;
	sign1 s;

	*why = "cannot read";
	if (f == NULL || ferror(f) || fclose(f) != 0) {
		return -1;
	}
	*why = "not an epoch statement";
	if (n > MAX_EPOCH_SIZE || parse_sign1(raw, n, &s) != 0 || s.ctype == NULL ||
	    !bytes_eq(s.ctype, s.ctype_n, content_epoch, strlen(content_epoch))) {
		return -1;
	}
	one[0] = 0x81;
	hn = bstr_head(one + 1, n, 2);
	memcpy(one + 1 + hn, raw, n);
	return efsdev_trust_update(t, one, 1 + hn + n, 0, &c, why) == 0 ? 0 : -1;
}

/* point_of returns pk's EC P-256 point as 0x04 || X || Y. */
static int point_of(mbedtls_pk_context *pk, uint8_t q[65])
{
	mbedtls_ecp_keypair *ec;
	size_t n;

	if (mbedtls_pk_get_type(pk) != MBEDTLS_PK_ECKEY || (ec = mbedtls_pk_ec(*pk)) == NULL ||
	    ec->grp.id != MBEDTLS_ECP_DP_SECP256R1) {
		return -1;
	}
	return mbedtls_ecp_point_write_binary(&ec->grp, &ec->Q, MBEDTLS_ECP_PF_UNCOMPRESSED, &n, q, 65) == 0 && n == 65 ? 0 : -1;
}

int efsdev_trust_init(efsdev_trust *t, const char *root_pub, const char *root_kid, const char *store)
{
	mbedtls_pk_context pk;
	uint8_t q[65];
	int rc;

	memset(t, 0, sizeof *t);
	mbedtls_pk_init(&pk);
	rc = mbedtls_pk_parse_public_keyfile(&pk, root_pub) == 0 ? point_of(&pk, q) : -1;
	mbedtls_pk_free(&pk);
	return rc == 0 ? efsdev_trust_init_point(t, q, root_kid, store) : -1;
}

int efsdev_trust_init_point(efsdev_trust *t, const uint8_t root[65], const char *root_kid, const char *store)
{
	memset(t, 0, sizeof *t);
	if (strlen(root_kid) < 1 || strlen(root_kid) > EFS_MAX_KEY_ID || strlen(store) >= sizeof t->path) {
		return -1;
	}
	snprintf(t->root_kid, sizeof t->root_kid, "%s", root_kid);
	snprintf(t->path, sizeof t->path, "%s", store);
	memcpy(t->root, root, 65);
	if (load_point(&t->root_key, t->root) != 0) {
		return -1;
	}
	t->root_loaded = 1;
	return 0;
}

void efsdev_trust_free(efsdev_trust *t)
{
	int i;

	for (i = 0; i < t->ncerts; i++) {
		free(t->certs[i].raw);
		mbedtls_ecp_keypair_free(&t->certs[i].pub);
	}
	if (t->root_loaded) {
		mbedtls_ecp_keypair_free(&t->root_key);
		t->root_loaded = 0;
	}
	free(t->rev_raw);
	free(t->epoch_raw);
	t->ncerts = 0;
	t->rev_raw = NULL;
	t->epoch_raw = NULL;
	t->epoch = 0;
}

/* revoked says whether kid is on the list held. */
static int revoked(const efsdev_trust *t, const uint8_t *kid, size_t kid_n)
{
	rd r = {t->rev_payload, t->rev_payload_n, t->rev_kids_off};
	unsigned m;
	uint64_t n, k;

	if (t->rev_raw == NULL || t->rev_kids_off == 0 || head(&r, &m, &n) != 0 || m != 4) {
		return 0;
	}
	for (k = 0; k < n; k++) {
		const uint8_t *p;
		size_t pn;
		if (str(&r, 2, &p, &pn) != 0) {
			return 1; /* a list we cannot read revokes: fail closed */
		}
		if (bytes_eq(p, pn, kid, kid_n)) {
			return 1;
		}
	}
	return 0;
}

int efsdev_trust_revoked_kids(const efsdev_trust *t, void (*each)(void *user, const uint8_t *kid, size_t n), void *user)
{
	rd r = {t->rev_payload, t->rev_payload_n, t->rev_kids_off};
	unsigned m;
	uint64_t n, k;

	if (t->rev_raw == NULL) {
		return 0;
	}
	if (t->rev_kids_off == 0 || head(&r, &m, &n) != 0 || m != 4) {
		return -1;
	}
	for (k = 0; k < n; k++) {
		const uint8_t *p;
		size_t pn;
		if (str(&r, 2, &p, &pn) != 0) {
			return -1;
		}
		each(user, p, pn);
	}
	return 0;
}

/* covers is Certificate.covers: an id, "prefix*" or "*". */
static int covers(const efsdev_cert *c, const uint8_t *device, size_t dn)
{
	rd r = {c->payload, c->payload_n, c->devices_off};
	unsigned m;
	uint64_t n, k;

	if (head(&r, &m, &n) != 0 || m != 4) {
		return 0;
	}
	for (k = 0; k < n; k++) {
		const uint8_t *p;
		size_t pn;
		if (str(&r, 3, &p, &pn) != 0) {
			return 0;
		}
		if (bytes_eq(p, pn, device, dn) || (pn > 0 && p[pn - 1] == '*' && dn >= pn - 1 && memcmp(p, device, pn - 1) == 0)) {
			return 1;
		}
	}
	return 0;
}

int efsdev_verify(void *user, const uint8_t *kid, size_t kid_len, const uint8_t *device, size_t device_len,
	const uint8_t digest[32], const uint8_t sig[64])
{
	efsdev_trust *t = user;
	int64_t now = (int64_t)time(NULL);
	int i;

	for (i = 0; i < t->ncerts; i++) {
		efsdev_cert *c = &t->certs[i];
		if (!bytes_eq(c->kid, c->kid_len, kid, kid_len)) {
			continue;
		}
		if (revoked(t, kid, kid_len)) {
			return EFS_PORT_UNKNOWN_KEY;
		}
		if (c->role != 0 || now < c->not_before || now >= c->not_after || !covers(c, device, device_len)) {
			return EFS_PORT_NOT_AUTHORISED; /* a device key, expired, or not for this device */
		}
		return es256_verify(&c->pub, digest, sig) == 0 ? EFS_PORT_OK : EFS_PORT_BAD_SIGNATURE;
	}
	return EFS_PORT_UNKNOWN_KEY;
}

int efsdev_verify_root(void *user, const uint8_t *kid, size_t kid_len, const uint8_t digest[32], const uint8_t sig[64])
{
	efsdev_trust *t = user;

	if (!t->root_loaded || !bytes_eq(kid, kid_len, t->root_kid, strlen(t->root_kid))) {
		return EFS_PORT_UNKNOWN_KEY; /* not the operator root */
	}
	return es256_verify(&t->root_key, digest, sig) == 0 ? EFS_PORT_OK : EFS_PORT_BAD_SIGNATURE;
}

/* The blinding generator of the device key's deterministic signatures. */
static mbedtls_entropy_context entropy;
static mbedtls_ctr_drbg_context drbg;
static int drbg_ready;

int efsdev_signer_open(efsdev_signer *s, const char *key_path, const char *cert_path, const char *device,
	efsdev_trust *t, const char **why)
{
	mbedtls_pk_context pk;
	uint8_t q[65];
	efsdev_cert c;
	sign1 st;
	uint8_t *raw = NULL;
	FILE *f;
	long size;
	int ok;

	memset(s, 0, sizeof *s);
	*why = "device key: want a PKCS#8 PEM P-256 key";
	mbedtls_pk_init(&pk);
	if (mbedtls_pk_parse_keyfile(&pk, key_path, NULL) != 0 || point_of(&pk, q) != 0) {
		mbedtls_pk_free(&pk);
		return -1;
	}
	mbedtls_ecp_keypair_init(&s->key);
	ok = mbedtls_ecp_copy(&s->key.Q, &mbedtls_pk_ec(pk)->Q) == 0 && mbedtls_mpi_copy(&s->key.d, &mbedtls_pk_ec(pk)->d) == 0 &&
	     mbedtls_ecp_group_load(&s->key.grp, MBEDTLS_ECP_DP_SECP256R1) == 0;
	mbedtls_pk_free(&pk);
	*why = "device certificate: cannot read";
	if (!ok || (f = fopen(cert_path, "rb")) == NULL) {
		return -1;
	}
	if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > 0 && size <= (long)EFSDEV_MAX_STATEMENT && fseek(f, 0, SEEK_SET) == 0 &&
	    (raw = malloc((size_t)size)) != NULL && fread(raw, 1, (size_t)size, f) == (size_t)size) {
		*why = "device certificate: not the root's device certificate of this key for this device";
		ok = open_statement(t, raw, (size_t)size, &st, why) == 0 &&
		     bytes_eq(st.ctype, st.ctype_n, content_cert, strlen(content_cert)) &&
		     parse_cert(st.payload, st.payload_n, &c) == 0 && c.role == 1 && memcmp(c.q, q, 65) == 0;
		c.payload = st.payload;
		c.payload_n = st.payload_n;
		ok = ok && c.ndevices == 1 && covers(&c, (const uint8_t *)device, strlen(device));
		if (ok) {
			memcpy(s->kid, c.kid, c.kid_len);
			s->kid_len = c.kid_len;
		}
	} else {
		ok = 0;
	}
	fclose(f);
	free(raw);
	if (!ok) {
		return -1;
	}
	if (!drbg_ready) {
		mbedtls_entropy_init(&entropy);
		mbedtls_ctr_drbg_init(&drbg);
		if (mbedtls_ctr_drbg_seed(&drbg, mbedtls_entropy_func, &entropy, (const unsigned char *)"efsdev", 6) != 0) {
			*why = "no entropy for the signature's blinding";
			return -1;
		}
		drbg_ready = 1;
	}
	s->ready = 1;
	return 0;
}

void efsdev_signer_free(efsdev_signer *s)
{
	if (s->ready) {
		mbedtls_ecp_keypair_free(&s->key);
		s->ready = 0;
	}
}

size_t efsdev_sign(efsdev_signer *s, const char *ctype, const uint8_t *payload, size_t n, uint8_t *out, size_t cap)
{
	uint8_t prot[4 + 2 + 64 + 1 + 2 + EFS_MAX_KEY_ID], digest[32], sig[64];
	size_t pn = 0, at = 0, cn = strlen(ctype);
	mbedtls_mpi r, sv;
	int ret;

	if (!s->ready || cn > 64 || cap < n + sizeof prot + 80) {
		return 0;
	}
	prot[pn++] = 0xa3;
	prot[pn++] = 0x01;
	prot[pn++] = 0x26; /* alg: -7, ES256 */
	prot[pn++] = 0x03;
	pn += bstr_head(prot + pn, cn, 3);
	memcpy(prot + pn, ctype, cn);
	pn += cn;
	prot[pn++] = 0x04;
	pn += bstr_head(prot + pn, s->kid_len, 2);
	memcpy(prot + pn, s->kid, s->kid_len);
	pn += s->kid_len;
	if (sig_digest(prot, pn, payload, n, digest) != 0) {
		return 0;
	}
	mbedtls_mpi_init(&r);
	mbedtls_mpi_init(&sv);
	/* the key's own group: mbedTLS keeps its table for the generator there */
	ret = mbedtls_ecdsa_sign_det_ext(&s->key.grp, &r, &sv, &s->key.d, digest, 32, MBEDTLS_MD_SHA256, mbedtls_ctr_drbg_random, &drbg);
	if (ret == 0) {
		ret = mbedtls_mpi_write_binary(&r, sig, 32);
	}
	if (ret == 0) {
		ret = mbedtls_mpi_write_binary(&sv, sig + 32, 32);
	}
	mbedtls_mpi_free(&sv);
	mbedtls_mpi_free(&r);
	if (ret != 0) {
		return 0;
	}
	out[at++] = 0xd2;
	out[at++] = 0x84;
	at += bstr_head(out + at, pn, 2);
	memcpy(out + at, prot, pn);
	at += pn;
	out[at++] = 0xa0;
	at += bstr_head(out + at, n, 2);
	memcpy(out + at, payload, n);
	at += n;
	out[at++] = 0x58;
	out[at++] = 64;
	memcpy(out + at, sig, 64);
	return at + 64;
}

/* uint_head appends an unsigned integer's shortest head. */
static size_t uint_head(uint8_t *h, uint64_t v)
{
	int k, len;

	if (v < 24) {
		h[0] = (uint8_t)v;
		return 1;
	}
	len = v < 256 ? 1 : v < 65536 ? 2 : v <= 0xffffffffu ? 4 : 8;
	h[0] = (uint8_t)(len == 1 ? 24 : len == 2 ? 25 : len == 4 ? 26 : 27);
	for (k = 0; k < len; k++) {
		h[1 + k] = (uint8_t)(v >> (8 * (len - 1 - k)));
	}
	return (size_t)len + 1;
}

size_t efsdev_state_report(const char *device, efs_state s, uint64_t counter, const uint8_t *state, size_t sn, uint8_t *out,
	size_t cap)
{
	size_t at = 0, dn = strlen(device);
	efs_mark m = s.mark;

	if (cap < sn + dn + 58) {
		return 0;
	}
	out[at++] = s.epoch > 0 ? 0xa6 : 0xa5; /* key 6, the epoch, only when there is one */
	out[at++] = 0x01;
	at += bstr_head(out + at, dn, 3);
	memcpy(out + at, device, dn);
	at += dn;
	out[at++] = 0x02;
	at += uint_head(out + at, m.token);
	out[at++] = 0x03;
	at += uint_head(out + at, m.seq);
	out[at++] = 0x04;
	at += uint_head(out + at, counter);
	out[at++] = 0x05;
	memcpy(out + at, state, sn);
	at += sn;
	if (s.epoch > 0) {
		out[at++] = 0x06;
		at += uint_head(out + at, s.epoch);
	}
	return at;
}
