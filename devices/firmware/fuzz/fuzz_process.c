/*
 * libFuzzer target for the C fence point: efs_handle (the decoder, the
 * COSE_Sign1 structure, the admit rule with epochs, the mark's write, the
 * operator's resets) and efs_open over arbitrary flash contents, on
 * test/host.c's simulated NOR flash (included below with its main renamed)
 * and, for signed commands and resets, its mbedTLS port.
 *
 * Built by fuzz_test.go with clang -fsanitize=fuzzer,address,undefined and
 * run briefly in `make test`, longer by `make fuzz`. Besides the sanitizers
 * it checks what the fence point promises, and aborts if not:
 *   - every result gives an ack that encodes in EFS_MAX_ACK_SIZE bytes;
 *   - applied only if accepted, only a command of the device's epoch, and
 *     then the new state (epoch and mark) survives a reboot (durable
 *     before effect); not applied: the state is unchanged, or, if the
 *     write was cut (a storage error), the old or the new one;
 *   - a reset accepted puts the device in its epoch, above the one it was
 *     at, and survives a reboot; then it is a replay;
 *   - after a cut the device reopens (the last complete mark is valid);
 *   - a command applied is a duplicate when redelivered, never applied twice;
 *   - a damaged store (efs_open refuses it) applies nothing;
 *   - no byte of flash is programmed twice between erases.
 *
 * Input: [flags][cut][fleet][device length d][d bytes: the device's name]
 * [if flags & 8: 2-byte length L, L bytes over the flash from sector 0]
 * [if flags & 4: 2-byte length P, P bytes: a command processed first]
 * [the rest: the command]. flags & 1: the context requires signed commands
 * (and its fleet epoch, port.epoch, is fleet); flags & 2: the power is cut
 * after `cut` bytes of the command's write; flags & 16: the port holds the
 * vectors' operator root (resets).
 *
 * EFS_FUZZ_SEEDS=dir: write the seed corpus (every input of
 * testdata/vectors.h in this format, and a few flash images) to dir, exit.
 */
#include <stdio.h>
#include <stdlib.h>

#define main efs_host_main
#include "../test/host.c"
#undef main

enum { F_SIGNED = 1, F_CUT = 2, F_PRIME = 4, F_FLASH = 8, F_ROOT = 16 };

#define must(cond)                                                               \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "fuzz_process.c:%d: %s\n", __LINE__, #cond); \
			abort();                                                 \
		}                                                                \
	} while (0)

typedef struct {
	const uint8_t *p;
	size_t n;
} cursor;

/* take returns the next k bytes of c, or NULL if fewer are left. */
static const uint8_t *take(cursor *c, size_t k)
{
	const uint8_t *p = c->p;

	if (c->n < k) {
		return NULL;
	}
	c->p += k;
	c->n -= k;
	return p;
}

/* take_part returns a part written as a 2-byte length and its bytes. */
static const uint8_t *take_part(cursor *c, size_t *n)
{
	const uint8_t *h = take(c, 2);

	if (h == NULL) {
		return NULL;
	}
	*n = (size_t)h[0] << 8 | h[1];
	return take(c, *n);
}

static int same(efs_state a, efs_state b)
{
	return a.epoch == b.epoch && a.mark.token == b.mark.token && a.mark.seq == b.mark.seq;
}

static uint64_t fuzz_fleet;

static uint64_t fuzz_epoch(void *user)
{
	(void)user;
	return fuzz_fleet;
}

static void check_ack(const efs_result *r)
{
	efs_ack a;
	uint8_t out[EFS_MAX_ACK_SIZE];
	size_t len;

	efs_result_ack(r, &a);
	must(efs_encode_ack(&a, out, sizeof out, &len) == EFS_OK);
}

/* check_after checks the state a reboot finds after a command or a reset
 * (prior: the device's state before it). */
static void check_after(flash *f, efs_ctx *c, const efs_port *p, efs_state prior, const efs_result *r, int cut)
{
	efs_state now, said = { r->epoch, r->mark };

	must(r->apply == (r->verdict == EFS_ACCEPTED && !r->reset));
	must(!r->apply || (r->env.epoch == prior.epoch && r->epoch == prior.epoch));
	must(power_on(f, c, p) == EFS_OK);
	now = efs_state_of(c);
	if (r->verdict == EFS_ACCEPTED) { /* a command applied, or a reset: durable */
		must(same(now, said) && (!r->reset || (said.epoch > prior.epoch && c->reset_epoch == said.epoch)));
	} else if (cut && r->err == EFS_E_STORAGE) {
		efs_state next = { prior.epoch, { r->env.token, r->env.seq } };

		must(same(now, prior) || same(now, next) || (r->reset && now.epoch > prior.epoch));
	} else {
		must(same(now, prior));
	}
	must(f->violations == 0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cursor in = { data, size };
	const uint8_t *h = take(&in, 4), *dev, *image = NULL, *prime = NULL;
	size_t dn, ln = 0, pn = 0;
	flash f;
	efs_port port;
	efs_ctx c;
	efs_result r;
	efs_state prior;
	efs_err opened;

	if (h == NULL || (dev = take(&in, dn = h[3])) == NULL ||
		((h[0] & F_FLASH) && (image = take_part(&in, &ln)) == NULL) ||
		((h[0] & F_PRIME) && (prime = take_part(&in, &pn)) == NULL)) {
		return -1; /* not in the format: not added to the corpus */
	}
	flash_init(&f, &port);
	fuzz_fleet = h[2];
	port.epoch = fuzz_epoch;
	if (h[0] & F_SIGNED) {
		port.sha256 = port_sha256;
		port.verify = port_verify;
	}
	if (h[0] & F_ROOT) {
		port.sha256 = port_sha256;
		port.verify_root = port_verify_root;
	}
	if (image != NULL) {
		memcpy(f.mem, image, ln < sizeof f.mem ? ln : sizeof f.mem);
	}
	opened = efs_open(&c, &port);
	if (prime != NULL) {
		efs_handle(&c, dev, dn, prime, pn, &r);
		check_ack(&r);
		must(opened == EFS_OK || r.verdict != EFS_ACCEPTED);
	}
	prior = efs_state_of(&c);
	f.programmed = 0;
	if (h[0] & F_CUT) {
		f.program_budget = h[1];
	}
	efs_handle(&c, dev, dn, in.p, in.n, &r);
	check_ack(&r);
	if (opened != EFS_OK) { /* damaged store: fail closed */
		must(r.verdict == EFS_INVALID);
		return 0;
	}
	check_after(&f, &c, &port, prior, &r, h[0] & F_CUT);
	if (r.verdict == EFS_ACCEPTED) { /* redelivered after the reboot: a duplicate, or a replayed reset */
		efs_result again;

		prior = efs_state_of(&c);
		efs_handle(&c, dev, dn, in.p, in.n, &again);
		check_ack(&again);
		must(r.reset ? again.verdict == EFS_INVALID && again.err == EFS_E_RESET_REPLAY
			     : again.verdict == EFS_DUPLICATE && !again.apply);
		check_after(&f, &c, &port, prior, &again, 0);
	}
	return 0;
}

/* ---- seeds ---- */

static int seed_n;

static void put_part(FILE *o, const uint8_t *p, size_t n)
{
	fputc((int)(n >> 8), o);
	fputc((int)(n & 0xff), o);
	fwrite(p, 1, n, o);
}

static void seed(const char *dir, int flags, uint8_t fleet, const efs_vblob *device, const uint8_t *image, size_t ln,
	const efs_vblob *prime, const efs_vblob *cmd)
{
	char path[4096];
	size_t dn, pn, n;
	uint8_t *d = blob(device, &dn), *p = blob(prime, &pn), *m = blob(cmd, &n);
	FILE *o;

	if (pn > 0) {
		flags |= F_PRIME;
	}
	if (image != NULL) {
		flags |= F_FLASH;
	}
	snprintf(path, sizeof path, "%s/seed-%04d", dir, seed_n++);
	o = fopen(path, "wb");
	if (o == NULL) {
		perror(path);
		exit(1);
	}
	fputc(flags, o);
	fputc(40, o); /* a cut in the middle of a slot, where flags ask for one */
	fputc(fleet, o);
	fputc((int)(dn > 255 ? 255 : dn), o);
	fwrite(d, 1, dn > 255 ? 255 : dn, o);
	if (image != NULL) {
		put_part(o, image, ln);
	}
	if (pn > 0) {
		put_part(o, p, pn);
	}
	fwrite(m, 1, n, o);
	if (fclose(o) != 0) {
		perror(path);
		exit(1);
	}
	free(d);
	free(p);
	free(m);
}

static void write_seeds(const char *dir)
{
	static const uint8_t devname[] = "dev";
	const efs_vblob none = { NULL, 0, 0, 0, NULL, 0 }, dev = { devname, 3, 0, 0, NULL, 0 };
	rig d;
	uint8_t cmd[512];
	efs_vblob next = { cmd, 0, 0, 0, NULL, 0 };

	for (size_t i = 0; i < EFS_VDECODES_N; i++) {
		const efs_vdecode *v = &efs_vdecodes[i];

		seed(dir, 0, 0, v->ok ? &v->device : &dev, NULL, 0, &none, &v->in);
	}
	for (size_t i = 0; i < EFS_VPROCESSES_N; i++) {
		seed(dir, 0, 0, &efs_vprocesses[i].device, NULL, 0, &efs_vprocesses[i].prime, &efs_vprocesses[i].in);
		seed(dir, F_CUT, 0, &efs_vprocesses[i].device, NULL, 0, &efs_vprocesses[i].prime, &efs_vprocesses[i].in);
	}
	for (size_t i = 0; i < EFS_VSIGNED_N; i++) {
		seed(dir, F_SIGNED, 0, &efs_vsigned[i].device, NULL, 0, &efs_vsigned[i].prime, &efs_vsigned[i].in);
	}
	for (size_t i = 0; i < EFS_VRESETS_N; i++) {
		const efs_vreset *v = &efs_vresets[i];

		seed(dir, F_ROOT, 0, &v->device, NULL, 0, v->before.pre_n > 0 ? &v->before : &v->prime, &v->in);
	}
	for (size_t i = 0; i < EFS_VEPOCHS_N; i++) { /* each step after the one before it */
		const efs_vepoch *sc = &efs_vepochs[i];
		const efs_vblob epoch_dev = { (const uint8_t *)"dev-e", 5, 0, 0, NULL, 0 };

		for (size_t k = 0; k < sc->n; k++) {
			seed(dir, F_ROOT | (sc->signed_cmds ? F_SIGNED : 0) | (k % 3 == 2 ? F_CUT : 0),
				(uint8_t)sc->steps[k].fleet, &epoch_dev, NULL, 0, k > 0 ? &sc->steps[k - 1].in : &none,
				&sc->steps[k].in);
		}
	}
	/* Flash images: two marks written (both sectors in use), then one
	 * torn in its write; each with the next command. */
	rig_start(&d, 2);
	next.pre_n = envelope_at(cmd, "dev", 0, 6, 1, "gateway-c");
	seed(dir, 0, 0, &dev, &d.f.mem[0][0], sizeof d.f.mem, &none, &next);
	d.f.programmed = 0;
	d.f.program_budget = 60;
	send(&d.c, 6, 1, &d.r);
	next.pre_n = envelope_at(cmd, "dev", 0, 6, 2, "gateway-c");
	seed(dir, 0, 0, &dev, &d.f.mem[0][0], sizeof d.f.mem, &none, &next);
	/* A device after a reset of epoch 3 (format 3), with a command of that
	 * epoch and one of the epoch before it. */
	flash_init(&d.f, &d.port);
	d.port.sha256 = port_sha256;
	d.port.verify_root = port_verify_root;
	efs_open(&d.c, &d.port);
	for (size_t i = 0; i < EFS_VRESETS_N; i++) {
		if (strcmp(efs_vresets[i].name, "down to 2/1") == 0) {
			size_t n;
			uint8_t *in = blob(&efs_vresets[i].in, &n);

			efs_handle(&d.c, (const uint8_t *)"dev-r", 5, in, n, &d.r);
			free(in);
		}
	}
	next.pre_n = envelope_at(cmd, "dev-r", 3, 6, 1, "gateway-c");
	seed(dir, F_ROOT, 0, &(efs_vblob){ (const uint8_t *)"dev-r", 5, 0, 0, NULL, 0 }, &d.f.mem[0][0], sizeof d.f.mem,
		&none, &next);
	next.pre_n = envelope_at(cmd, "dev-r", 2, 6, 1, "gateway-c");
	seed(dir, F_ROOT, 0, &(efs_vblob){ (const uint8_t *)"dev-r", 5, 0, 0, NULL, 0 }, &d.f.mem[0][0], sizeof d.f.mem,
		&none, &next);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *dir = getenv("EFS_FUZZ_SEEDS");

	(void)argc;
	(void)argv;
	if (dir != NULL && *dir != 0) {
		write_seeds(dir);
		printf("%d seeds written to %s\n", seed_n, dir);
		exit(0);
	}
	return 0;
}
