/*
 * libFuzzer target for efsdev's trust (linux/trust.c, included below with
 * its static decoders): trust updates (efsdev_trust_update, against the
 * vectors' root), certificate payloads (parse_cert), revocation lists
 * (parse_revocations), epoch statements' payloads (parse_epoch) and
 * COSE_Sign1 statements (parse_sign1).
 *
 * Built by fuzz_test.go with clang -fsanitize=fuzzer,address,undefined and
 * run briefly in `make test`, longer by `make fuzz`. Besides the sanitizers
 * it checks, and aborts if not:
 *   - an update is taken whole or refused whole: refused, the store is as
 *     before; taken, every certificate held has a kid of 1 to 64 bytes, a
 *     role of 0 or 1, devices and a validity window, an epoch statement is
 *     held with its epoch (at least 1), and taking the same update again
 *     adopts nothing (each statement is held, the epoch unchanged);
 *   - a certificate, list or epoch the decoders take reads the same a
 *     second time, and its fields keep their bounds (devices, key ids
 *     inside the payload; an epoch of at least 1).
 *
 * Input: [mode][the rest]. mode % 5: 0 a trust update; 1 a certificate's
 * payload; 2 a revocation list's payload; 3 a statement; 4 an epoch
 * statement's payload.
 *
 * EFS_FUZZ_SEEDS=dir: write the seed corpus (every update of
 * testdata/trust_vectors.h, and the payloads of its valid statements) to
 * dir, exit.
 */
#define _POSIX_C_SOURCE 200809L
#include "../linux/trust.c"
#include "../testdata/trust_vectors.h"

#define must(cond)                                                             \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "fuzz_trust.c:%d: %s\n", __LINE__, #cond); \
			abort();                                               \
		}                                                              \
	} while (0)

static efsdev_trust store;

static void check_store(const efsdev_trust *t)
{
	for (int i = 0; i < t->ncerts; i++) {
		const efsdev_cert *c = &t->certs[i];
		must(c->kid_len >= 1 && c->kid_len <= EFS_MAX_KEY_ID);
		must(c->role == 0 || c->role == 1);
		must(c->ndevices >= 1 && c->not_after > c->not_before);
		must(c->payload >= c->raw && c->payload + c->payload_n <= c->raw + c->raw_n);
	}
}

static void fuzz_update(const uint8_t *p, size_t n)
{
	efsdev_trust_counts c;
	const char *why = "";
	int rc;

	must(efsdev_trust_init_point(&store, efs_troot_point, efs_troot_kid, "") == 0);
	rc = efsdev_trust_update(&store, p, n, 0, &c, &why);
	must(rc == 0 || rc == -1);
	if (rc != 0) {
		must(store.ncerts == 0 && store.rev_raw == NULL && store.epoch_raw == NULL && store.epoch == 0); /* refused whole */
	} else {
		uint64_t epoch = store.epoch;

		check_store(&store);
		must((store.epoch_raw != NULL) == (store.epoch != 0) && store.epoch_n <= MAX_EPOCH_SIZE);
		must(efsdev_trust_update(&store, p, n, 0, &c, &why) == 0 && c.applied == 0 && store.epoch == epoch);
	}
	efsdev_trust_free(&store);
}

static void fuzz_cert(const uint8_t *p, size_t n)
{
	efsdev_cert c, again;

	if (parse_cert(p, n, &c) != 0) {
		return;
	}
	must(c.kid_len >= 1 && c.kid_len <= EFS_MAX_KEY_ID && c.ndevices >= 1 && c.devices_off < n);
	must(c.role == 0 || c.role == 1);
	must(parse_cert(p, n, &again) == 0 && again.serial == c.serial && again.ndevices == c.ndevices);
}

static void fuzz_revocations(const uint8_t *p, size_t n)
{
	uint64_t version, v2;
	size_t off, off2;

	if (parse_revocations(p, n, &version, &off) != 0) {
		return;
	}
	must(off < n || off == 0);
	must(parse_revocations(p, n, &v2, &off2) == 0 && v2 == version && off2 == off);
}

static void fuzz_epoch(const uint8_t *p, size_t n)
{
	uint64_t epoch, again;

	if (parse_epoch(p, n, &epoch) != 0) {
		return;
	}
	must(epoch >= 1 && parse_epoch(p, n, &again) == 0 && again == epoch);
}

static void fuzz_statement(const uint8_t *p, size_t n)
{
	sign1 s;

	if (parse_sign1(p, n, &s) != 0) {
		return;
	}
	must(s.kid != NULL && s.kid_n >= 1 && s.kid_n <= EFS_MAX_KEY_ID && s.sig_n == 64);
	must(s.payload >= p && s.payload + s.payload_n <= p + n && s.prot + s.prot_n <= p + n);
}

static uint8_t *tblob(const efs_tblob *b, size_t *n)
{
	uint8_t *p;

	*n = b->pre_n + b->fill_n + b->post_n;
	if ((p = malloc(*n + 1)) == NULL) {
		abort();
	}
	if (b->pre_n) {
		memcpy(p + 1, b->pre, b->pre_n);
	}
	memset(p + 1 + b->pre_n, b->fill, b->fill_n);
	if (b->post_n) {
		memcpy(p + 1 + b->pre_n + b->fill_n, b->post, b->post_n);
	}
	return p;
}

static int write_seed(const char *dir, const char *kind, size_t i, const uint8_t *p, size_t n)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof path, "%s/%s-%03u", dir, kind, (unsigned)i);
	return (f = fopen(path, "wb")) == NULL || fwrite(p, 1, n, f) != n || fclose(f) != 0;
}

/* write_seeds writes every update (mode 0), and each statement of a valid
 * one (mode 3) with its payload (mode 1 or 2). */
static int write_seeds(const char *dir)
{
	for (size_t i = 0; i < EFS_TUPDATES_N; i++) {
		size_t n;
		uint8_t *p = tblob(&efs_tupdates[i].in, &n);
		rd r = {p + 1, n, 0};
		unsigned m;
		uint64_t count;

		p[0] = 0;
		if (write_seed(dir, "update", i, p, n + 1)) {
			return 1;
		}
		if (efs_tupdates[i].ok && head(&r, &m, &count) == 0) {
			for (uint64_t k = 0; k < count; k++) {
				const uint8_t *st;
				size_t sn;
				sign1 s;
				uint8_t buf[EFSDEV_MAX_STATEMENT + 1];
				if (str(&r, 2, &st, &sn) != 0 || parse_sign1(st, sn, &s) != 0 || sn > EFSDEV_MAX_STATEMENT) {
					break;
				}
				buf[0] = 3;
				memcpy(buf + 1, st, sn);
				buf[0] = (uint8_t)(bytes_eq(s.ctype, s.ctype_n, content_revocations, strlen(content_revocations)) ? 2
					: bytes_eq(s.ctype, s.ctype_n, content_epoch, strlen(content_epoch))	   ? 4
														   : 1);
				memcpy(buf + 1, s.payload, s.payload_n);
				if (write_seed(dir, buf[0] == 2 ? "list" : buf[0] == 4 ? "epoch" : "cert", i * 8 + k, buf,
					    1 + s.payload_n)) {
					return 1;
				}
				buf[0] = 3;
				memcpy(buf + 1, st, sn);
				if (write_seed(dir, "statement", i * 8 + k, buf, 1 + sn)) {
					return 1;
				}
			}
		}
		free(p);
	}
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *dir = getenv("EFS_FUZZ_SEEDS");

	(void)argc;
	(void)argv;
	if (dir != NULL) {
		exit(write_seeds(dir));
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *p;

	if (size == 0) {
		return 0;
	}
	/* a copy of exactly the payload's size: a read past it is caught */
	if ((p = malloc(size - 1 > 0 ? size - 1 : 1)) == NULL) {
		abort();
	}
	memcpy(p, data + 1, size - 1);
	switch (data[0] % 5) {
	case 0:
		fuzz_update(p, size - 1);
		break;
	case 1:
		fuzz_cert(p, size - 1);
		break;
	case 2:
		fuzz_revocations(p, size - 1);
		break;
	case 3:
		fuzz_statement(p, size - 1);
		break;
	default:
		fuzz_epoch(p, size - 1);
	}
	free(p);
	return 0;
}
