/*
 * efsdev's firmware mode (--firmware): the library's firmware job
 * (efshim_fw.h) on files, as edgefence-devsim --firmware runs devices/fwjob.
 * One device per process, in its own directory (edgefence-devsim's
 * supervisor starts one efsdev per device with --dir <dir>/<id>):
 *
 *   slot-a, slot-b   the image slots, fwjob.SlotPath's names: an erase
 *                    empties the file, a program pwrites and fdatasyncs;
 *                    bytes past the end read as erased (0xFF), so a slot
 *                    holds exactly its image's bytes
 *   <id>.fwrec       the job record's two sectors (flash_file.c)
 *   <id>.flash       the mark, <id>.state the thermostat (as without)
 *
 * At start the boot loader's decision (efs_fw_boot); a trial boot's health
 * is the image's own (devices/sim's markers: EDGEFENCE-HEALTH=fail fails,
 * =crash kills the process (a power cut: the try is spent), =hang answers
 * nothing within the window); EDGEFENCE-VERSION= is the "firmware" the
 * device reports. With the operator's root (--trust-root or --reset-root)
 * every fw.begin must carry the root's manifest of its image (port.root_kid;
 * the signature through the fence port's verify_root, the resets' hook),
 * and the operator's resets are taken (efs_fw_handle).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "efsdev.h"

static int slot_fd(efsdev_fw_dev *f, unsigned slot)
{
	if (slot > 1) {
		return -1;
	}
	if (f->slot_fd[slot] < 0) {
		char path[PATH_MAX];
		snprintf(path, sizeof path, "%s/slot-%c", f->dir, slot == 0 ? 'a' : 'b');
		f->slot_fd[slot] = open(path, O_RDWR | O_CREAT, 0600);
	}
	return f->slot_fd[slot];
}

static int sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY), rc;

	if (fd < 0) {
		return -1;
	}
	rc = fsync(fd);
	close(fd);
	return rc;
}

static int slot_read(void *user, unsigned slot, uint32_t off, uint8_t *buf, size_t n)
{
	int fd = slot_fd(user, slot);
	size_t got = 0;

	if (fd < 0) {
		return -1;
	}
	while (got < n) {
		ssize_t k = pread(fd, buf + got, n - got, (off_t)off + (off_t)got);
		if (k < 0 && errno == EINTR) {
			continue;
		}
		if (k < 0) {
			return -1;
		}
		if (k == 0) {
			memset(buf + got, 0xff, n - got); /* past the image: erased */
			break;
		}
		got += (size_t)k;
	}
	return 0;
}

static int slot_erase(void *user, unsigned slot)
{
	efsdev_fw_dev *f = user;
	int fd = slot_fd(f, slot);

	if (fd < 0 || ftruncate(fd, 0) != 0 || fdatasync(fd) != 0) {
		return -1;
	}
	return sync_dir(f->dir);
}

static int slot_program(void *user, unsigned slot, uint32_t off, const uint8_t *buf, size_t n)
{
	int fd = slot_fd(user, slot);
	size_t put = 0;

	if (fd < 0) {
		return -1;
	}
	while (put < n) {
		ssize_t k = pwrite(fd, buf + put, n - put, (off_t)off + (off_t)put);
		if (k < 0 && errno == EINTR) {
			continue;
		}
		if (k <= 0) {
			return -1;
		}
		put += (size_t)k;
	}
	return fdatasync(fd);
}

/* marker finds an image marker's value (sim.ParseMarkers: the first
 * occurrence, up to 64 bytes of [A-Za-z0-9._+-]). */
static void marker(const uint8_t *img, size_t n, const char *name, char *out, size_t cap)
{
	size_t mn = strlen(name), i, k;

	out[0] = '\0';
	for (i = 0; i + mn <= n; i++) {
		if (memcmp(img + i, name, mn) != 0) {
			continue;
		}
		for (k = 0; k + 1 < cap && k < 64 && i + mn + k < n; k++) {
			uint8_t c = img[i + mn + k];
			if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
				c == '+' || c == '-')) {
				break;
			}
			out[k] = (char)c;
		}
		out[k] = '\0';
		return;
	}
}

/* markers reads the running slot's image and its markers. */
static int markers(efsdev_fw_dev *f, const efs_fw_boot_info *b, char *health, size_t hcap)
{
	uint8_t *img = malloc(b->size > 0 ? (size_t)b->size : 1);

	if (img == NULL || slot_read(f, b->slot, 0, img, (size_t)b->size) != 0) {
		free(img);
		return -1;
	}
	marker(img, (size_t)b->size, "EDGEFENCE-HEALTH=", health, hcap);
	marker(img, (size_t)b->size, "EDGEFENCE-VERSION=", f->version, sizeof f->version);
	free(img);
	return 0;
}

/* health is a trial boot's health check: the image's marker decides. */
static efs_err health(efsdev_fw_dev *f, const efs_fw_boot_info *b, uint32_t window_ms)
{
	char h[65];

	if (markers(f, b, h, sizeof h) != 0) {
		return efs_fw_health(&f->fw, 0, "the running image is unreadable");
	}
	if (strcmp(h, "fail") == 0) {
		return efs_fw_health(&f->fw, 0, "sim: image health check failed: image marked EDGEFENCE-HEALTH=fail");
	}
	if (strcmp(h, "crash") == 0) {
		fprintf(stderr, "level=WARN msg=\"health check: the image crashes the device (EDGEFENCE-HEALTH=crash)\"\n");
		raise(SIGKILL); /* a power loss: the try efs_fw_boot spent stays spent */
	}
	if (strcmp(h, "hang") == 0) {
		char why[128];
		struct timespec ts = { (time_t)(window_ms / 1000), (long)(window_ms % 1000) * 1000000L };
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
		}
		snprintf(why, sizeof why, "did not pass within %ums", (unsigned)window_ms);
		return efs_fw_health(&f->fw, 0, why);
	}
	return efs_fw_health(&f->fw, 1, NULL);
}

/* factory makes slot a's file, empty, on the first boot (fwjob's factory:
 * an empty image if there is none) and returns its size. */
static int factory(efsdev_fw_dev *f, uint32_t *size)
{
	struct stat st;
	int fd = slot_fd(f, 0);

	if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size > UINT32_MAX) {
		return -1;
	}
	*size = (uint32_t)st.st_size;
	return fdatasync(fd) == 0 ? sync_dir(f->dir) : -1;
}

/* The record's sectors and the root's verify take the device as user. */
static int rec_read(void *user, unsigned s, uint32_t off, uint8_t *buf, size_t n)
{
	efsdev_fw_dev *f = user;
	return f->rec_read(&f->rec, s, off, buf, n);
}

static int rec_erase(void *user, unsigned s)
{
	efsdev_fw_dev *f = user;
	return f->rec_erase(&f->rec, s);
}

static int rec_program(void *user, unsigned s, uint32_t off, const uint8_t *buf, size_t n)
{
	efsdev_fw_dev *f = user;
	return f->rec_program(&f->rec, s, off, buf, n);
}

static void accepting(void *user, const efs_result *r)
{
	efsdev_fw_dev *f = user;

	f->accepted = 1;
	if (f->on_accept != NULL) {
		f->on_accept(f->accept_user, r);
	}
}

/* open_ports opens the job record's file and fills the port: slots,
 * record, the factory image (slot a, made empty on the first boot). */
static int open_ports(efsdev_fw_dev *f, const char *id, const efsdev_fw_opts *o, const char **why)
{
	char path[PATH_MAX];
	efs_port rec;

	snprintf(path, sizeof path, "%s/%s.fwrec", f->dir, id);
	if (efsdev_flash_open(&f->rec, path) != 0) {
		*why = "job record file";
		return -1;
	}
	efsdev_flash_port(&f->rec, &rec);
	f->port.user = f;
	f->port.slot_size = o->max_image;
	f->port.record_sector_size = rec.sector_size;
	f->port.slot_read = slot_read;
	f->port.slot_erase = slot_erase;
	f->port.slot_program = slot_program;
	f->rec_read = rec.flash_read;
	f->rec_erase = rec.flash_erase;
	f->rec_program = rec.flash_program;
	f->port.record_read = rec_read;
	f->port.record_erase = rec_erase;
	f->port.record_program = rec_program;
	f->port.boot_tries = o->tries;
	f->port.factory_security = o->security;
	f->port.accepting = accepting;
	if (factory(f, &f->port.factory_size) != 0) {
		*why = "slot a";
		return -1;
	}
	return 0;
}

int efsdev_fw_open(efsdev_fw_dev *f, const char *dir, const char *id, efs_ctx *fence, const efsdev_fw_opts *o,
	efsdev_trust *trust, int (*other)(void *, const struct efs_envelope *, const char **), const char **why)
{
	char health_buf[65];
	efs_fw_boot_info b;
	efs_err e;
	void (*on_accept)(void *, const efs_result *) = f->on_accept;
	void *accept_user = f->accept_user;

	memset(f, 0, sizeof *f);
	f->on_accept = on_accept;
	f->accept_user = accept_user;
	f->slot_fd[0] = f->slot_fd[1] = -1;
	if (strlen(dir) >= sizeof f->dir) {
		*why = "directory name too long";
		return -1;
	}
	snprintf(f->dir, sizeof f->dir, "%s", dir);
	if (open_ports(f, id, o, why) != 0) {
		return -1;
	}
	f->port.other = other;
	if (trust != NULL) {
		f->port.root_kid = (const uint8_t *)trust->root_kid;
		f->port.root_kid_len = strlen(trust->root_kid);
	}
	if ((e = efs_fw_open(&f->fw, &f->port, fence)) != EFS_OK) {
		*why = efs_strerror(e);
		return -1;
	}
	if ((e = efs_fw_boot(&f->fw, &b)) != EFS_OK) {
		*why = efs_strerror(e);
		return -1;
	}
	if (b.trial && (e = health(f, &b, o->window_ms)) != EFS_OK) {
		*why = efs_strerror(e);
		return -1;
	}
	if (!b.trial && markers(f, &b, health_buf, sizeof health_buf) != 0) {
		f->version[0] = '\0';
	}
	return 0;
}

/* CBOR heads and strings. */
static size_t head(uint8_t *o, unsigned major, uint64_t v)
{
	unsigned w = v < 24 ? 0 : v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffu ? 4 : 8;

	o[0] = (uint8_t)(major << 5 | (w == 0 ? v : w == 1 ? 24 : w == 2 ? 25 : w == 4 ? 26 : 27));
	for (unsigned k = 0; k < w; k++) {
		o[1 + k] = (uint8_t)(v >> (8 * (w - 1 - k)));
	}
	return 1 + w;
}

static size_t text(uint8_t *o, const char *s, size_t n)
{
	size_t h = head(o, 3, n);

	memcpy(o + h, s, n);
	return h + n;
}

static size_t key_text(uint8_t *o, const char *k, const char *v, size_t vn)
{
	size_t n = text(o, k, strlen(k));

	return n + text(o + n, v, vn);
}

static size_t key_uint(uint8_t *o, const char *k, uint64_t v)
{
	size_t n = text(o, k, strlen(k));

	return n + head(o + n, 0, v);
}

/* fw_map writes fwjob.Status.Report's map. */
static size_t fw_map(const efs_fw *fw, uint8_t *o)
{
	static const char hex[] = "0123456789abcdef";
	const efs_fw_job *j = &fw->job;
	const efs_fw_boot_state *b = &fw->boot;
	const uint8_t *img = b->running == b->active ? b->active_image :
		(b->trial != EFS_FW_NO_SLOT && b->running == b->trial) ? b->trial_image : NULL;
	const char *slot = b->running == 0 ? "a" : b->running == 1 ? "b" : "";
	char ih[64];
	size_t n = head(o, 5, 11);

	for (int i = 0; img != NULL && i < 32; i++) {
		ih[2 * i] = hex[img[i] >> 4];
		ih[2 * i + 1] = hex[img[i] & 15];
	}
	n += key_text(o + n, "job", (const char *)j->id, j->id_len);
	n += key_text(o + n, "state", efs_fw_state_name((efs_fw_state)j->state),
		strlen(efs_fw_state_name((efs_fw_state)j->state)));
	n += key_uint(o + n, "bytes", j->bytes);
	n += key_uint(o + n, "size", j->size);
	n += key_text(o + n, "slot", slot, strlen(slot));
	n += key_uint(o + n, "version", b->security);
	n += key_text(o + n, "reason", j->reason, j->reason_len);
	n += key_uint(o + n, "token", j->token);
	n += key_text(o + n, "image", ih, img != NULL ? 64 : 0);
	n += key_uint(o + n, "seq", j->seq);
	n += key_uint(o + n, "boots", b->boots);
	return n;
}

size_t efsdev_fw_report(const efsdev_fw_dev *f, const efsdev_state *s, uint8_t *out, size_t cap)
{
	size_t n, vn = strlen(f->version);

	if (cap < 1024 + EFS_FW_MAX_JOB + EFS_FW_MAX_REASON || (n = efsdev_state_cbor(s, out, cap)) == 0) {
		return 0;
	}
	out[0] = (uint8_t)(out[0] + (vn > 0 ? 2 : 1)); /* sim.FirmwareState: State's map, "fw", "firmware" */
	n += text(out + n, "fw", 2);
	n += fw_map(&f->fw, out + n);
	if (vn > 0) {
		n += key_text(out + n, "firmware", f->version, vn);
	}
	return n;
}

/* efsdev_fw_duration_ms parses a Go duration of one unit (ms, s, m). */
int efsdev_fw_duration_ms(const char *s, uint32_t *ms)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	if (end == s || v > 86400000ul) {
		return -1;
	}
	if (strcmp(end, "ms") == 0) {
		*ms = (uint32_t)v;
	} else if (strcmp(end, "s") == 0) {
		*ms = (uint32_t)(v * 1000);
	} else if (strcmp(end, "m") == 0 && v <= 1440) {
		*ms = (uint32_t)(v * 60000);
	} else {
		return -1;
	}
	return 0;
}

/* note_head reads a CBOR head at *i of b (n bytes): its major type and
 * argument; -1 past the end or for what a step's body never holds. */
static int note_head(const uint8_t *b, size_t n, size_t *i, unsigned *major, uint64_t *arg)
{
	unsigned ai, w;

	if (*i >= n) {
		return -1;
	}
	*major = b[*i] >> 5;
	ai = b[(*i)++] & 31u;
	w = ai < 24 ? 0 : ai == 24 ? 1 : ai == 25 ? 2 : ai == 26 ? 4 : ai == 27 ? 8 : 99;
	if (w == 99 || n - *i < w) {
		return -1;
	}
	*arg = w == 0 ? ai : 0;
	while (w-- > 0) {
		*arg = *arg << 8 | b[(*i)++];
	}
	return *major > 5 || ((*major == 2 || *major == 3) && *arg > n - *i) ? -1 : 0;
}

void efsdev_fw_note(const efs_envelope *env, char job[EFS_FW_MAX_JOB + 1], char image[65])
{
	static const char hex[] = "0123456789abcdef";
	const uint8_t *b = env->body.p;
	size_t n = env->body.n, i = 0, kn = 0;
	unsigned major;
	uint64_t pairs, arg;
	const uint8_t *key = NULL;

	job[0] = image[0] = '\0';
	if (env->kind.n < 3 || memcmp(env->kind.p, "fw.", 3) != 0 || note_head(b, n, &i, &major, &pairs) != 0 || major != 5) {
		return;
	}
	for (uint64_t k = 0; k < 2 * pairs; k++) {
		if (note_head(b, n, &i, &major, &arg) != 0 || major == 4 || major == 5) {
			return; /* a body fwjob would refuse: no note */
		}
		if (k % 2 == 0) {
			key = b + i;
			kn = major == 3 ? (size_t)arg : 0;
		} else if (kn == 3 && memcmp(key, "job", 3) == 0 && major == 3 && arg <= EFS_FW_MAX_JOB) {
			memcpy(job, b + i, (size_t)arg);
			job[arg] = '\0';
		} else if (kn == 5 && memcmp(key, "image", 5) == 0 && major == 2 && arg == 32 &&
			env->kind.n == 8 && memcmp(env->kind.p, "fw.begin", 8) == 0) {
			for (size_t h = 0; h < 32; h++) {
				image[2 * h] = hex[b[i + h] >> 4];
				image[2 * h + 1] = hex[b[i + h] & 15];
			}
			image[64] = '\0';
		}
		i += major == 2 || major == 3 ? (size_t)arg : 0;
	}
}

static void hex_field(char *out, size_t cap, size_t *at, const char *key, const uint8_t *b, size_t n)
{
	static const char hex[] = "0123456789abcdef";

	*at += (size_t)snprintf(out + *at, cap - *at, ",\"%s\":\"", key);
	for (size_t i = 0; i < n && *at + 3 < cap; i++) {
		out[(*at)++] = hex[b[i] >> 4];
		out[(*at)++] = hex[b[i] & 15];
	}
	*at += (size_t)snprintf(out + *at, cap - *at, "\"");
}

static int zero32(const uint8_t *b)
{
	for (int i = 0; i < 32; i++) {
		if (b[i] != 0) {
			return 0;
		}
	}
	return 1;
}

int efsdev_fw_status(efsdev_fw_dev *f, const char *dir, const char *id, efs_ctx *fence, const efsdev_fw_opts *o)
{
	static const char *const slots[] = { "a", "b" };
	char out[2048];
	size_t at = 0;
	const char *why = "";
	const efs_fw_job *j = &f->fw.job;
	const efs_fw_boot_state *b = &f->fw.boot;
	efs_err e = EFS_OK;

	memset(f, 0, sizeof *f);
	f->slot_fd[0] = f->slot_fd[1] = -1;
	snprintf(f->dir, sizeof f->dir, "%s", dir);
	if (strlen(dir) >= sizeof f->dir || open_ports(f, id, o, &why) != 0 ||
		(e = efs_fw_open(&f->fw, &f->port, fence)) != EFS_OK) {
		fprintf(stderr, "efsdev: --fw-status: %s %s\n", why, efs_strerror(e));
		return 1;
	}
	if (f->fw.cur < 0) {
		fprintf(stderr, "efsdev: --fw-status: the device never booted\n");
		return 1;
	}
	at += (size_t)snprintf(out, sizeof out, "{\"Job\":");
	efsdev_json_string(out, sizeof out, &at, (const char *)j->id, j->id_len);
	at += (size_t)snprintf(out + at, sizeof out - at, ",\"State\":\"%s\",\"Bytes\":%llu,\"Size\":%llu,\"Version\":%llu,"
		"\"Token\":%llu,\"Seq\":%llu,\"Slot\":\"%s\",\"Active\":\"%s\",\"Trial\":\"%s\",\"Tries\":%u,\"Security\":%llu,"
		"\"Boots\":%llu,\"Reason\":", efs_fw_state_name((efs_fw_state)j->state), (unsigned long long)j->bytes,
		(unsigned long long)j->size, (unsigned long long)j->version, (unsigned long long)j->token,
		(unsigned long long)j->seq, b->running <= 1 ? slots[b->running] : "", b->active <= 1 ? slots[b->active] : "",
		b->trial <= 1 ? slots[b->trial] : "", (unsigned)b->tries, (unsigned long long)b->security,
		(unsigned long long)b->boots);
	efsdev_json_string(out, sizeof out, &at, j->reason, j->reason_len);
	hex_field(out, sizeof out, &at, "Image", j->image, zero32(j->image) ? 0 : 32);
	hex_field(out, sizeof out, &at, "ActiveImage", b->active_image, 32);
	hex_field(out, sizeof out, &at, "TrialImage", b->trial_image, b->trial <= 1 ? 32 : 0);
	printf("%.*s}\n", (int)at, out);
	return 0;
}
