/*
 * The operator's image manifest (fence/auth's VerifyManifest, devices/fwjob's
 * checkManifest) in C. A manifest is a COSE_Sign1 by the operator's root:
 * tag 18, the protected header a map of exactly alg (1) = ES256 (-7), kid (4)
 * = the root's kid and content type (3) = "application/edgefence-manifest+cbor",
 * an empty unprotected header, the payload a byte string holding
 *
 *	{1 image SHA-256 (32 bytes), 2 size (uint >= 1), 3 security version
 *	 (uint), 4 name (text, <= 64 bytes, optional), 5 issued (int, information)}
 *
 * and a 64-byte signature r || s over the Sig_structure ["Signature1",
 * protected, h'', payload]. The library decodes and checks everything but the
 * signature, hashes the Sig_structure with its own SHA-256 (no copy), and
 * hands the digest to the root hook the resets use too (the fence port's
 * verify_root, with the manifest's kid, after the library compared it with
 * the firmware port's root_kid). The checks run in fence/auth's
 * order and refuse with its sentinels' words (auth's malformed details are
 * C's own), so the same manifest gets the same verdict, class and reason up
 * to the sentinel in C and Go (testdata/fw_vectors.h).
 */
#include <string.h>

#include "efs_fw_internal.h"

static const char ct_manifest[] = "application/edgefence-manifest+cbor";

/* The refusal classes of fence/auth (their error text, wrapped in
 * fence.ErrInvalid's). */
enum { M_OK = 0, M_UNSIGNED, M_MALFORMED, M_ALG, M_UNKNOWN_KEY, M_BAD_SIGNATURE, M_IMAGE_LEN };

static const char *const sentinel[] = { "", "auth: not a signed envelope: ", "auth: malformed signed envelope: ",
	"auth: algorithm not accepted: ", "auth: unknown signer key: ", "auth: bad signature: ",
	"auth: malformed signed envelope: " };

/* A decoded manifest: the COSE parts and the payload's fields. */
typedef struct {
	efs_bytes prot, payload, sig, kid, ctype;
	efs_bytes image, name;
	uint64_t size, version;
	const char *why; /* a malformed one's detail */
} manifest;

static int malformed(manifest *m, const char *why)
{
	m->why = why;
	return M_MALFORMED;
}

/* item reads a definite byte or text string of major type major. */
static int item(efs_rd *r, unsigned major, efs_bytes *out)
{
	efs_head h;

	if (efs_read_head(r, &h) != EFS_OK || h.major != major || h.arg > (uint64_t)(r->n - r->i)) {
		return -1;
	}
	out->p = r->b + r->i;
	out->n = (size_t)h.arg;
	r->i += out->n;
	return 0;
}

/* header checks the protected header (auth's decodeSign1): only alg, kid
 * and content type, no label twice, alg ES256, kid 1 to 64 bytes, content
 * type text. */
static int header(manifest *m)
{
	efs_rd r = { m->prot.p, m->prot.n, 0 };
	efs_head h, kh, vh;
	unsigned seen = 0;
	int alg = 0;

	if (m->prot.n == 0) {
		return M_ALG; /* an empty header: no alg */
	}
	if (efs_read_head(&r, &h) != EFS_OK || h.major != 5 || h.arg > 16) {
		return malformed(m, "protected header: not a map");
	}
	for (uint64_t k = 0; k < h.arg; k++) {
		if (efs_read_head(&r, &kh) != EFS_OK || kh.major != 0 || (kh.arg != 1 && kh.arg != 3 && kh.arg != 4)) {
			return malformed(m, "protected header: only alg, kid and content type");
		}
		if (seen & 1u << kh.arg) {
			return malformed(m, "protected header: a label twice");
		}
		seen |= 1u << kh.arg;
		if (kh.arg == 1) {
			if (efs_read_head(&r, &vh) != EFS_OK || (vh.major > 1 && vh.major != 3) ||
				(vh.major == 3 && vh.arg > (uint64_t)(r.n - r.i))) {
				return malformed(m, "protected header: alg of another type");
			}
			r.i += vh.major == 3 ? (size_t)vh.arg : 0; /* a name: not ES256 */
			alg = vh.major == 1 && vh.arg == 6;     /* -7: ES256 */
		} else if (item(&r, kh.arg == 4 ? 2 : 3, kh.arg == 4 ? &m->kid : &m->ctype) != 0) {
			return malformed(m, kh.arg == 4 ? "kid: want a byte string" : "content type: want text");
		}
	}
	if (r.i != r.n) {
		return malformed(m, "protected header: bytes after the map");
	}
	if (!alg) {
		return M_ALG;
	}
	if (!(seen & 1u << 4) || m->kid.n == 0 || m->kid.n > EFS_MAX_KEY_ID) {
		return malformed(m, "kid: want 1 to 64 bytes in the protected header");
	}
	if ((seen & 1u << 3) && m->ctype.n == 0) {
		return malformed(m, "content type: want text");
	}
	return M_OK;
}

/* cose reads the COSE_Sign1 (auth's decodeSign1 and openStatement's
 * content type). */
static int cose(manifest *m, efs_bytes raw)
{
	efs_rd r = { raw.p, raw.n, 2 };
	efs_head h;
	int e;

	if (raw.n < 2 || raw.p[0] != 0xd2 || raw.p[1] != 0x84) {
		return M_UNSIGNED;
	}
	if (item(&r, 2, &m->prot) != 0) {
		return malformed(m, "protected header: want a byte string");
	}
	if (efs_read_head(&r, &h) != EFS_OK || h.major != 5 || h.arg != 0) {
		return malformed(m, "unprotected header must be empty");
	}
	if (item(&r, 2, &m->payload) != 0) {
		return malformed(m, "payload: want a byte string (detached payloads are not accepted)");
	}
	if (item(&r, 2, &m->sig) != 0 || m->sig.n == 0) {
		return malformed(m, "signature: want a non-empty byte string");
	}
	if (r.i != r.n) {
		return malformed(m, "bytes after the message");
	}
	if ((e = header(m)) != M_OK) {
		return e;
	}
	if (!efs_bytes_equal(m->ctype.p, m->ctype.n, (const uint8_t *)ct_manifest, sizeof ct_manifest - 1)) {
		return malformed(m, "statement of another content type, want \"application/edgefence-manifest+cbor\"");
	}
	return M_OK;
}

/* field reads the payload's field k's value; null and undefined leave it
 * empty. */
static int field(efs_rd *r, uint64_t k, manifest *m)
{
	efs_head h;
	size_t at = r->i;
	int v = efs_fw_value_head(r, &h);

	if (v <= 0) {
		return v;
	}
	switch (k) {
	case 1:
	case 4:
		r->i = at;
		return item(r, k == 1 ? 2 : 3, k == 1 ? &m->image : &m->name) != 0 ||
			(k == 4 && !efs_utf8_valid(m->name.p, m->name.n)) ? -1 : 0;
	case 2:
	case 3:
		if (h.major != 0) {
			return -1;
		}
		*(k == 2 ? &m->size : &m->version) = h.arg;
		return 0;
	default: /* issued: an int64 */
		return (h.major != 0 && h.major != 1) || h.arg > INT64_MAX ? -1 : 0;
	}
}

/* payload decodes the manifest's fields (fence/auth's trustDec: integer
 * keys 1 to 5, each at most once, no unknown field, no trailing bytes). */
static int payload(manifest *m)
{
	efs_rd r = { m->payload.p, m->payload.n, 0 };
	efs_head h, kh;
	unsigned seen = 0;

	if (efs_read_head(&r, &h) != EFS_OK || (h.major != 5 && !(h.major == 7 && (h.ai == 22 || h.ai == 23)))) {
		return malformed(m, "manifest payload: not a map");
	}
	for (uint64_t k = 0; h.major == 5 && k < h.arg; k++) {
		if (efs_read_head(&r, &kh) != EFS_OK || kh.major != 0 || kh.arg < 1 || kh.arg > 5) {
			return malformed(m, "manifest payload: a key that is not 1 to 5");
		}
		if ((seen & 1u << kh.arg) || field(&r, kh.arg, m) != 0) {
			return malformed(m, "manifest payload: a field twice or of the wrong type");
		}
		seen |= 1u << kh.arg;
	}
	return r.i == r.n ? M_OK : malformed(m, "manifest payload: bytes after the map");
}

/* verify hashes the Sig_structure in place and asks the fence port's
 * root hook (verify_root, the resets' too). */
static int verify(const efs_port *root, const manifest *m)
{
	static const uint8_t context[] = { 0x84, 0x6a, 'S', 'i', 'g', 'n', 'a', 't', 'u', 'r', 'e', '1' };
	uint8_t head[9], digest[32];
	efs_sha256_ctx h;

	if (m->sig.n != 64) {
		return M_BAD_SIGNATURE;
	}
	efs_sha256_init(&h);
	efs_sha256_update(&h, context, sizeof context);
	efs_sha256_update(&h, head, efs_bstr_head(head, m->prot.n));
	efs_sha256_update(&h, m->prot.p, m->prot.n);
	head[0] = 0x40; /* external_aad: empty */
	efs_sha256_update(&h, head, 1);
	efs_sha256_update(&h, head, efs_bstr_head(head, m->payload.n));
	efs_sha256_update(&h, m->payload.p, m->payload.n);
	efs_sha256_final(&h, digest);
	switch (root->verify_root(root->user, m->kid.p, m->kid.n, digest, m->sig.p)) {
	case EFS_PORT_OK:
		return M_OK;
	case EFS_PORT_UNKNOWN_KEY: /* the fence port's root is not root_kid's: refused all the same */
		return M_UNKNOWN_KEY;
	default:
		return M_BAD_SIGNATURE;
	}
}

/* valid is auth's Manifest.Validate. */
static int valid(manifest *m)
{
	if (m->image.n != 32) {
		return M_IMAGE_LEN;
	}
	if (m->size == 0) {
		return malformed(m, "manifest: size 0");
	}
	for (size_t i = 0; i < m->name.n; i++) {
		const uint8_t *p = m->name.p;
		if (p[i] < 0x20 || p[i] == 0x7f || (p[i] == 0xc2 && i + 1 < m->name.n && p[i + 1] < 0xa0)) {
			m->name.n = EFS_FW_MAX_NAME + 1;
		}
	}
	if (m->name.n > EFS_FW_MAX_NAME) {
		return malformed(m, "manifest: name must be up to 64 bytes of text without control characters");
	}
	return M_OK;
}

/* add_hex writes b in lower-case hex. */
static void add_hex(efs_fw_text *t, const uint8_t *b, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	char s[3] = { 0, 0, 0 };

	for (size_t i = 0; i < n; i++) {
		s[0] = hex[b[i] >> 4];
		s[1] = hex[b[i] & 15];
		efs_fw_add(t, s);
	}
}

/* refuse writes fwjob's words for a manifest auth refused. */
static efs_fw_err refuse(const efs_fw_port *port, const manifest *m, int e, efs_fw_text *t)
{
	efs_fw_add(t, "fence: invalid envelope: ");
	efs_fw_add(t, sentinel[e]);
	switch (e) {
	case M_UNSIGNED:
		efs_fw_add(t, "want COSE_Sign1 (tag 18, array of 4)");
		break;
	case M_ALG:
		efs_fw_add(t, "want ES256");
		break;
	case M_UNKNOWN_KEY:
		efs_fw_add(t, "manifest signed by ");
		add_hex(t, m->kid.p, m->kid.n);
		efs_fw_add(t, ", not the operator root ");
		add_hex(t, port->root_kid, port->root_kid_len);
		break;
	case M_BAD_SIGNATURE:
		efs_fw_add(t, "manifest");
		break;
	case M_IMAGE_LEN:
		efs_fw_add(t, "manifest: image SHA-256 of ");
		efs_fw_add_u64(t, m->image.n);
		efs_fw_add(t, " bytes, want 32");
		break;
	default:
		efs_fw_add(t, m->why);
	}
	return EFS_FW_E_MANIFEST;
}

/* add_named writes "<image hex>, <size> bytes, version <version>". */
static void add_named(efs_fw_text *t, const uint8_t image[32], uint64_t size, uint64_t version)
{
	add_hex(t, image, 32);
	efs_fw_add(t, ", ");
	efs_fw_add_u64(t, size);
	efs_fw_add(t, " bytes, version ");
	efs_fw_add_u64(t, version);
}

/* mismatch writes fwjob's words for a manifest of another image. */
static void mismatch(const manifest *m, const efs_fw_step *s, efs_fw_text *t)
{
	efs_fw_add(t, "signed for image ");
	add_named(t, m->image.p, m->size, m->version);
	efs_fw_add(t, "; fw.begin names ");
	add_named(t, s->image.p, s->size, s->version);
}

efs_fw_err efs_fw_manifest(const efs_fw_port *port, const efs_port *root, const efs_fw_step *s, efs_fw_text *t)
{
	manifest m;
	int e;

	if (port->root_kid_len == 0) {
		return EFS_FW_OK; /* only bounded, as fwjob without Config.Manifests */
	}
	memset(&m, 0, sizeof m);
	t->at = 7; /* after "check: " */
	t->buf[t->at] = '\0';
	efs_fw_add(t, "fwjob: image manifest refused: fw.begin of job ");
	efs_fw_add_bytes(t, s->job);
	efs_fw_add(t, ": manifest: ");
	if (s->manifest.n == 0) {
		efs_fw_add(t, "none: this device installs only images the operator signed");
		return EFS_FW_E_MANIFEST;
	}
	if ((e = cose(&m, s->manifest)) == M_OK && (e = payload(&m)) == M_OK &&
		!efs_bytes_equal(m.kid.p, m.kid.n, port->root_kid, port->root_kid_len)) {
		e = M_UNKNOWN_KEY;
	}
	if (e == M_OK && root->verify_root == NULL) {
		e = M_BAD_SIGNATURE; /* root_kid without the fence port's root hook: nothing verifies */
	} else if (e == M_OK && (e = verify(root, &m)) == M_OK) {
		e = valid(&m);
	}
	if (e != M_OK) {
		return refuse(port, &m, e, t);
	}
	if (!efs_bytes_equal(m.image.p, m.image.n, s->image.p, s->image.n) || m.size != s->size ||
		m.version != s->version) {
		mismatch(&m, s, t);
		return EFS_FW_E_MANIFEST;
	}
	return EFS_FW_OK;
}
