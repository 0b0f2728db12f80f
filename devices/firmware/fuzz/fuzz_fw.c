/*
 * libFuzzer target for the firmware job: sequences of commands and reboots
 * through efs_fw_process, efs_fw_open, efs_fw_boot and efs_fw_health on
 * test/fw_host.c's simulated NOR flash (included below with its main
 * renamed), with a power cut at a chosen byte. Besides the sanitizers it
 * checks what the job promises, and aborts if not:
 *   - every boot succeeds and runs a slot whose bytes hash to the image the
 *     boot loader names (no half-written image ever boots);
 *   - after a boot, the mark and its epoch equal the job record's tag
 *     (reconciled), unless an operator's reset came since (the tag's reset
 *     counter is below the fence's, whose epoch is the reset's or later);
 *   - a step applied is in the record with its mark and epoch (durable
 *     before effect); a reset applied puts the device in its epoch;
 *   - no mark or record byte is programmed twice between erases, no slot
 *     byte programmed to another value.
 *
 * Input: [flags][cut: 2 bytes] then actions [op][length: 2 bytes][bytes]:
 * op % 4 == 0 a command (the bytes, to device "fw-1"), 1 a reboot with a
 * healthy verdict, 2 unhealthy, 3 a reboot that never gives one. flags & 1:
 * the power is cut after `cut` bytes programmed (restored by the next
 * reboot); flags & 2: the device holds the vectors' root (manifests, and
 * the operator's resets through efs_fw_handle; the signatures Go verified
 * are the ones that verify).
 *
 * EFS_FUZZ_SEEDS=dir: write the seed corpus (the scenarios of
 * testdata/fw_vectors.h in this format) to dir, exit.
 */
#include <stdio.h>
#include <stdlib.h>

#define main efs_fw_host_main
#include "../test/fw_host.c"
#undef main

#define must(cond)                                                               \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "fuzz_fw.c:%d: %s\n", __LINE__, #cond);  \
			abort();                                                 \
		}                                                                \
	} while (0)

static void reboot(dev *d, int op)
{
	uint8_t s[32];

	if (op == 3) { /* no verdict: the new image hangs, the watchdog reboots */
		d->f.off = 0;
		d->f.program_budget = -1;
		d->f.erase_budget = -1;
		must(efs_open(&d->c, &d->port) == EFS_OK && efs_fw_open(&d->fw, &d->fport, &d->c) == EFS_OK &&
			efs_fw_boot(&d->fw, &d->boot) == EFS_OK);
	} else {
		must(power_on(d, op == 1) == EFS_OK);
	}
	must(d->boot.slot <= 1 && d->boot.size <= SLOT);
	sum(d->f.mem[4 + d->boot.slot], (size_t)d->boot.size, s);
	must(memcmp(s, d->boot.image, 32) == 0);
	if (d->fw.job.counter == d->c.reset_counter) {
		must(d->c.mark.token == d->fw.job.token && d->c.mark.seq == d->fw.job.seq && d->c.epoch == d->fw.job.epoch);
	} else { /* a reset since the record's step: the mark is the reset's, or a step's after it */
		must(d->c.reset_counter > d->fw.job.counter && d->c.epoch >= d->c.reset_epoch && d->c.reset_epoch > 0);
	}
}

static void run(const uint8_t *in, size_t n)
{
	dev d;
	size_t i = 3;

	if (n < 3) {
		return;
	}
	dev_init(&d, 0);
	must(failures == 0);
	if (in[0] & 2) {
		d.fport.root_kid = (const uint8_t *)EFS_FWV_ROOT_KID;
		d.fport.root_kid_len = strlen(EFS_FWV_ROOT_KID);
		d.port.sha256 = lib_sha256;
		d.port.verify_root = root_verify;
	}
	if (in[0] & 1) {
		d.f.programmed = 0;
		d.f.program_budget = (long)(in[1] | in[2] << 8);
	}
	while (i + 3 <= n) {
		int op = in[i] % 4;
		size_t len = (size_t)(in[i + 1] | in[i + 2] << 8);

		i += 3;
		if (len > n - i) {
			len = n - i;
		}
		if (op == 0) {
			uint8_t *cmd = malloc(len ? len : 1);

			must(cmd != NULL);
			if (len > 0) {
				memcpy(cmd, in + i, len);
			}
			efs_fw_handle(&d.fw, (const uint8_t *)"fw-1", 4, cmd, len, &d.r);
			must(!d.r.apply || (d.r.verdict == EFS_ACCEPTED && !d.r.reset));
			if (d.r.apply) {
				must(d.fw.job.token == d.r.mark.token && d.fw.job.seq == d.r.mark.seq && d.fw.job.epoch == d.r.epoch &&
					d.c.mark.token == d.r.mark.token && d.c.mark.seq == d.r.mark.seq && d.c.epoch == d.r.epoch &&
					d.r.env.epoch == d.r.epoch);
			}
			if (d.r.reset && d.r.verdict == EFS_ACCEPTED) {
				must(in[0] & 2);
				must(d.c.epoch == d.r.epoch && d.c.reset_epoch == d.r.epoch && d.c.mark.token == d.r.mark.token);
			}
			free(cmd);
		} else {
			reboot(&d, op);
		}
		i += len;
	}
	reboot(&d, 1);
	must(d.f.violations == 0);
}

/* write_seeds writes every scenario of the vectors as one input. */
static int write_seeds(const char *dir)
{
	static uint8_t buf[64 * 1024];

	for (size_t s = 0; s < EFS_FWVSCENARIOS_N; s++) {
		const efs_fwvscenario *sc = &efs_fwvscenarios[s];
		size_t n = 3;
		char path[4096];
		FILE *f;

		memset(buf, 0, 3);
		buf[0] = sc->manifests ? 2 : 0; /* the root: the scenario's manifests and resets */
		for (size_t k = 0; k < sc->n && n + 3 + sc->steps[k].in_n <= sizeof buf; k++) {
			const efs_fwvstep *v = &sc->steps[k];

			buf[n] = v->boot ? (v->healthy ? 1 : 2) : 0;
			buf[n + 1] = (uint8_t)v->in_n;
			buf[n + 2] = (uint8_t)(v->in_n >> 8);
			if (v->in_n > 0) {
				memcpy(buf + n + 3, v->in, v->in_n);
			}
			n += 3 + v->in_n;
		}
		snprintf(path, sizeof path, "%s/scenario-%02u", dir, (unsigned)s);
		if ((f = fopen(path, "wb")) == NULL || fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
			return 1;
		}
	}
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *dir = getenv("EFS_FUZZ_SEEDS");

	(void)argc;
	(void)argv;
	make_image();
	factory = (const uint8_t *)EFS_FWV_FACTORY;
	factory_n = strlen(EFS_FWV_FACTORY);
	factory_security = EFS_FWV_SECURITY;
	if (dir != NULL) {
		exit(write_seeds(dir));
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	run(data, size);
	return 0;
}
