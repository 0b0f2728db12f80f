/*
 * The firmware job's state machine (devices/fwjob's device.go, boot.go) in
 * C: the steps behind the fence point (efs_fw_process), the boot loader's
 * decision (efs_fw_boot, efs_fw_health) and the reconciliation of the mark
 * with the job record at start (efs_fw_open). The order of the writes and
 * why it is safe: efshim_fw.h.
 */
#include <string.h>

#include "efs_fw_internal.h"

static const char *const state_names[] = { "idle", "downloading", "downloaded", "installing", "installed",
	"rebooting", "confirming", "committed", "failed", "rolled_back" };

const char *efs_fw_state_name(efs_fw_state s)
{
	return (unsigned)s <= EFS_FW_ROLLED_BACK ? state_names[s] : "unknown";
}

static int in_progress(uint8_t s)
{
	return s != EFS_FW_IDLE && s != EFS_FW_COMMITTED && s != EFS_FW_FAILED && s != EFS_FW_ROLLED_BACK;
}

static const char *slot_name(uint8_t s)
{
	return s == 0 ? "a" : s == 1 ? "b" : "";
}

static efs_bytes job_id(const efs_fw_job *j)
{
	efs_bytes b = { j->id, j->id_len };

	return b;
}

/* set_reason sets the job's reason to s (clipped, as fwjob's clip). */
static void set_reason(efs_fw_job *j, const char *a, const char *b)
{
	char buf[EFS_FW_MAX_REASON + 1];
	efs_fw_text t = { buf, sizeof buf, 0 };

	efs_fw_add(&t, a);
	efs_fw_add(&t, b);
	while (t.at > 0 && !efs_utf8_valid((const uint8_t *)buf, t.at)) { /* a rune cut at the limit */
		t.at--;
	}
	memcpy(j->reason, buf, t.at);
	j->reason_len = (uint8_t)t.at;
}

/* A step's context: the fw, its decoded step, the reason being written. */
typedef struct {
	efs_fw *fw;
	efs_fw_step s;
	efs_fw_text t;
	efs_fw_job job;
	efs_fw_boot_state boot;
	int wrote; /* the record moved */
	int other; /* the application's command (port.other) */
} step_ctx;

static efs_fw_err illegal(step_ctx *x)
{
	efs_fw_add(&x->t, "fwjob: illegal step: ");
	efs_fw_add_bytes(&x->t, x->s.kind_name);
	efs_fw_add(&x->t, " of job ");
	efs_fw_add_bytes(&x->t, job_id(&x->job));
	efs_fw_add(&x->t, " in state ");
	efs_fw_add(&x->t, efs_fw_state_name(x->job.state));
	return EFS_FW_E_STATE;
}

static efs_fw_err advance(step_ctx *x, uint8_t from, uint8_t to)
{
	if (x->job.state != from) {
		return illegal(x);
	}
	x->job.state = to;
	return EFS_FW_OK;
}

/* begin_refused is fwjob's begin checks: "" or the refusal. */
static efs_fw_err begin_refused(step_ctx *x)
{
	efs_fw_text *t = &x->t;

	if (in_progress(x->job.state)) {
		return illegal(x);
	}
	if (efs_bytes_equal(x->job.id, x->job.id_len, x->s.job.p, x->s.job.n)) {
		efs_fw_add(t, "fwjob: illegal step: fw.begin of job ");
		efs_fw_add_bytes(t, x->s.job);
		efs_fw_add(t, ": it ran already, state ");
		efs_fw_add(t, efs_fw_state_name(x->job.state));
		return EFS_FW_E_STATE;
	}
	if (x->boot.running != x->boot.active) {
		efs_fw_add(t, "fwjob: illegal step: fw.begin of job ");
		efs_fw_add_bytes(t, x->s.job);
		efs_fw_add(t, ": state ");
		efs_fw_add(t, efs_fw_state_name(x->job.state));
		efs_fw_add(t, ", reboot pending (running slot ");
		efs_fw_add(t, slot_name(x->boot.running));
		efs_fw_add(t, ", boot slot ");
		efs_fw_add(t, slot_name(x->boot.active));
		efs_fw_add(t, ")");
		return EFS_FW_E_STATE;
	}
	if (x->s.version < x->boot.security) {
		efs_fw_add(t, "fwjob: security version below the running one: fw.begin of job ");
		efs_fw_add_bytes(t, x->s.job);
		efs_fw_add(t, ": image version ");
		efs_fw_add_u64(t, x->s.version);
		efs_fw_add(t, " below the running security version ");
		efs_fw_add_u64(t, x->boot.security);
		return EFS_FW_E_ROLLBACK;
	}
	return EFS_FW_OK;
}

/* begin starts a job: the inactive slot is erased (before the record). */
static efs_fw_err begin(step_ctx *x)
{
	efs_fw_err e = begin_refused(x);
	const efs_fw_port *port = x->fw->port;
	efs_fw_job *j = &x->job;

	if (e != EFS_FW_OK) {
		return e;
	}
	memset(j, 0, sizeof *j);
	j->slot = x->boot.active == 0 ? 1 : 0;
	if (port->slot_erase(port->user, j->slot) != 0) {
		efs_fw_add(&x->t, "fwjob: storage: slot ");
		efs_fw_add(&x->t, slot_name(j->slot));
		efs_fw_add(&x->t, ": erase failed");
		return EFS_FW_E_STORAGE;
	}
	memcpy(j->id, x->s.job.p, x->s.job.n);
	j->id_len = (uint8_t)x->s.job.n;
	j->state = EFS_FW_DOWNLOADING;
	memcpy(j->image, x->s.image.p, 32);
	j->size = x->s.size;
	j->chunk = x->s.chunk;
	j->version = x->s.version;
	return EFS_FW_OK;
}

static efs_fw_err chunk_refused(step_ctx *x)
{
	efs_fw_job *j = &x->job;
	efs_fw_text *t = &x->t;
	uint64_t n = x->s.data.n;

	if (j->state != EFS_FW_DOWNLOADING) {
		return illegal(x);
	}
	if (x->s.off != j->bytes) {
		efs_fw_add(t, "fwjob: chunk offset: job ");
		efs_fw_add_bytes(t, job_id(j));
		efs_fw_add(t, ": expected offset ");
		efs_fw_add_u64(t, j->bytes);
		efs_fw_add(t, ", got ");
		efs_fw_add_u64(t, x->s.off);
		return EFS_FW_E_OFFSET;
	}
	if (n > j->chunk || n > j->size - j->bytes) {
		efs_fw_add(t, "fwjob: bad command: job ");
		efs_fw_add_bytes(t, job_id(j));
		efs_fw_add(t, ": chunk of ");
		efs_fw_add_u64(t, n);
		efs_fw_add(t, n > j->chunk ? " bytes, the job's chunks are at most " : " bytes at ");
		efs_fw_add_u64(t, n > j->chunk ? j->chunk : x->s.off);
		if (n <= j->chunk) {
			efs_fw_add(t, " runs past the image's ");
			efs_fw_add_u64(t, j->size);
			efs_fw_add(t, " bytes");
		}
		return EFS_FW_E_COMMAND;
	}
	return EFS_FW_OK;
}

/* chunk programs the data at off (before the record) and counts it; the
 * last one is checked by hashing the slot back against the image. */
static efs_fw_err chunk(step_ctx *x)
{
	const efs_fw_port *port = x->fw->port;
	efs_fw_job *j = &x->job;
	efs_fw_err e = chunk_refused(x);
	uint8_t sum[32];

	if (e != EFS_FW_OK) {
		return e;
	}
	if (port->slot_program(port->user, j->slot, (uint32_t)x->s.off, x->s.data.p, x->s.data.n) != 0) {
		efs_fw_add(&x->t, "fwjob: storage: slot ");
		efs_fw_add(&x->t, slot_name(j->slot));
		efs_fw_add(&x->t, ": program failed");
		return EFS_FW_E_STORAGE;
	}
	j->bytes += x->s.data.n;
	if (j->bytes < j->size) {
		return EFS_FW_OK;
	}
	if (efs_fw_hash_slot(port, j->slot, j->size, sum) != 0) {
		efs_fw_add(&x->t, "fwjob: storage: slot unreadable");
		return EFS_FW_E_STORAGE;
	}
	if (efs_bytes_equal(sum, 32, j->image, 32)) {
		j->state = EFS_FW_DOWNLOADED;
	} else {
		char buf[EFS_FW_MAX_REASON + 1];
		efs_fw_text t = { buf, sizeof buf, 0 };

		efs_fw_add(&t, "received image SHA-256 ");
		efs_fw_add_short(&t, sum);
		efs_fw_add(&t, ", want ");
		efs_fw_add_short(&t, j->image);
		j->state = EFS_FW_FAILED;
		set_reason(j, buf, "");
	}
	return EFS_FW_OK;
}

/* disarm ends a trial; a job waiting on it is rolled back with reason. */
static void disarm(efs_fw_job *j, efs_fw_boot_state *b, const char *a, const char *why)
{
	b->trial = EFS_FW_NO_SLOT;
	memset(b->trial_image, 0, 32);
	b->trial_size = 0;
	b->tries = 0;
	if (j->state == EFS_FW_REBOOTING || j->state == EFS_FW_CONFIRMING) {
		j->state = EFS_FW_ROLLED_BACK;
		set_reason(j, a, why);
	}
}

static efs_fw_err cancel(step_ctx *x)
{
	switch (x->job.state) {
	case EFS_FW_DOWNLOADING:
	case EFS_FW_DOWNLOADED:
	case EFS_FW_INSTALLING:
	case EFS_FW_INSTALLED:
		x->job.state = EFS_FW_FAILED;
		set_reason(&x->job, "canceled", "");
		return EFS_FW_OK;
	case EFS_FW_REBOOTING:
	case EFS_FW_CONFIRMING:
		disarm(&x->job, &x->boot, "canceled", "");
		return EFS_FW_OK;
	default:
		return illegal(x);
	}
}

static efs_fw_err commit(step_ctx *x)
{
	efs_fw_boot_state *b = &x->boot;
	efs_fw_err e;

	if (x->job.state == EFS_FW_CONFIRMING && (b->trial == EFS_FW_NO_SLOT || b->running != b->trial)) {
		efs_fw_add(&x->t, "fwjob: storage: confirming, but the running slot ");
		efs_fw_add(&x->t, slot_name(b->running));
		efs_fw_add(&x->t, " is not the trial \"");
		efs_fw_add(&x->t, slot_name(b->trial));
		efs_fw_add(&x->t, "\"");
		return EFS_FW_E_STORAGE;
	}
	if ((e = advance(x, EFS_FW_CONFIRMING, EFS_FW_COMMITTED)) != EFS_FW_OK) {
		return e;
	}
	b->active = b->trial;
	memcpy(b->active_image, b->trial_image, 32);
	b->active_size = b->trial_size;
	b->security = b->security > x->job.version ? b->security : x->job.version;
	b->trial = EFS_FW_NO_SLOT;
	memset(b->trial_image, 0, 32);
	b->trial_size = 0;
	b->tries = 0;
	return EFS_FW_OK;
}

static efs_fw_err activate(step_ctx *x)
{
	efs_fw_err e = advance(x, EFS_FW_INSTALLED, EFS_FW_REBOOTING);
	uint8_t tries = x->fw->port->boot_tries;

	if (e == EFS_FW_OK) {
		x->boot.trial = x->job.slot;
		memcpy(x->boot.trial_image, x->job.image, 32);
		x->boot.trial_size = x->job.size;
		x->boot.tries = tries != 0 ? tries : (uint8_t)EFS_FW_DEFAULT_TRIES;
	}
	return e;
}

/* transition applies the step to x->job and x->boot (fwjob's step). */
static efs_fw_err transition(step_ctx *x)
{
	efs_fw_job *j = &x->job;
	efs_fw_text *t = &x->t;

	if (in_progress(j->state) && !efs_bytes_equal(x->s.job.p, x->s.job.n, j->id, j->id_len)) {
		efs_fw_add(t, "fwjob: another job in progress: job ");
		efs_fw_add_bytes(t, job_id(j));
		efs_fw_add(t, " in progress (state ");
		efs_fw_add(t, efs_fw_state_name(j->state));
		efs_fw_add(t, "): ");
		efs_fw_add_bytes(t, x->s.kind_name);
		efs_fw_add(t, " of job ");
		efs_fw_add_bytes(t, x->s.job);
		efs_fw_add(t, " refused");
		return EFS_FW_E_BUSY;
	}
	if (x->s.kind == FW_BEGIN) {
		return begin(x);
	}
	if (!efs_bytes_equal(x->s.job.p, x->s.job.n, j->id, j->id_len)) {
		efs_fw_add(t, "fwjob: illegal step: ");
		efs_fw_add_bytes(t, x->s.kind_name);
		efs_fw_add(t, " of job ");
		efs_fw_add_bytes(t, x->s.job);
		efs_fw_add(t, ": no such job here (state ");
		efs_fw_add(t, efs_fw_state_name(j->state));
		efs_fw_add(t, ", last job \"");
		efs_fw_add_bytes(t, job_id(j));
		efs_fw_add(t, "\")");
		return EFS_FW_E_STATE;
	}
	switch (x->s.kind) {
	case FW_CHUNK:
		return chunk(x);
	case FW_INSTALL:
		return advance(x, EFS_FW_DOWNLOADED, EFS_FW_INSTALLING);
	case FW_ACTIVATE:
		return activate(x);
	case FW_COMMIT:
		return commit(x);
	default:
		return cancel(x);
	}
}

static int hook_check(void *user, efs_result *r)
{
	step_ctx *x = user;

	x->t.buf = r->reason;
	x->t.cap = sizeof r->reason;
	x->t.at = 0;
	efs_fw_add(&x->t, "check: "); /* devices/shim's prefix of a Check refusal */
	if (efs_fw_is_other(x->fw->port, &r->env)) {
		x->other = 1;
		return efs_fw_other_check(x->fw->port, &r->env, &x->t);
	}
	x->fw->last = (uint8_t)efs_fw_parse(x->fw->port, x->fw->fence->port, &r->env, &x->s, &x->t);
	return x->fw->last != EFS_FW_OK;
}

/* hook_step runs the step after the admit rule: slot bytes, then the
 * record tagged with the new mark; the mark is stored after it returns. */
static int hook_step(void *user, efs_result *r)
{
	step_ctx *x = user;
	efs_fw *fw = x->fw;
	efs_fw_err e;

	x->t.at = 0;
	efs_fw_add(&x->t, "apply: "); /* devices/shim's prefix of an ApplyTx refusal */
	if (fw->broken || fw->cur < 0) {
		efs_fw_add(&x->t, fw->broken ? "fwjob: storage: the job record is ahead of the mark: restart"
					     : "fwjob: not booted");
		fw->last = EFS_FW_E_STORAGE;
		return 1;
	}
	if (x->other) {
		return 0; /* the caller applies it once the mark is stored */
	}
	x->job = fw->job;
	x->boot = fw->boot;
	if ((e = transition(x)) == EFS_FW_OK) {
		x->job.token = r->mark.token;
		x->job.seq = r->mark.seq;
		x->job.epoch = r->epoch;
		x->job.counter = fw->fence->reset_counter; /* the tag rolls forward only under this counter */
		if (efs_fw_save(fw, &x->job, &x->boot, r->env.holder, r->env.id) != EFS_OK) {
			x->t.at = 7;
			x->t.buf[7] = '\0';
			efs_fw_add(&x->t, "fwjob: storage: the job record could not be written");
			e = EFS_FW_E_STORAGE;
		} else {
			x->wrote = 1;
			if (fw->port->accepting != NULL) {
				fw->port->accepting(fw->port->user, r);
			}
		}
	}
	fw->last = (uint8_t)e;
	return e != EFS_FW_OK;
}

/* verify_slot hashes the first size bytes of slot against want (fwjob's
 * verifySlot): 1 if they match, else 0 with fwjob's words in t ("slot b
 * (N bytes) SHA-256 …, want …"). */
static int verify_slot(const efs_fw_port *port, uint8_t slot, uint64_t size, const uint8_t want[32], efs_fw_text *t)
{
	uint8_t sum[32] = { 0 };

	if (efs_fw_hash_slot(port, slot, size, sum) == 0 && efs_bytes_equal(sum, 32, want, 32)) {
		return 1;
	}
	efs_fw_add(t, "slot ");
	efs_fw_add(t, slot_name(slot));
	efs_fw_add(t, " (");
	efs_fw_add_u64(t, size);
	efs_fw_add(t, " bytes) SHA-256 ");
	efs_fw_add_short(t, sum);
	efs_fw_add(t, ", want ");
	efs_fw_add_short(t, want);
	return 0;
}

/* settle verifies a job left installing (fwjob's finishInstall) into
 * job: installed, or failed with the reason. */
static void settle(const efs_fw_port *port, efs_fw_job *j)
{
	char buf[EFS_FW_MAX_REASON + 1];
	efs_fw_text t = { buf, sizeof buf, 0 };

	if (j->state != EFS_FW_INSTALLING) {
		return;
	}
	efs_fw_add(&t, "install: ");
	if (verify_slot(port, j->slot, j->size, j->image, &t)) {
		j->state = EFS_FW_INSTALLED;
		return;
	}
	j->state = EFS_FW_FAILED;
	set_reason(j, buf, "");
}

/* save_same writes the record again with its tag (a boot's or a settle's
 * change: no new mark). */
static efs_err save_same(efs_fw *fw, const efs_fw_job *j, const efs_fw_boot_state *b)
{
	efs_bytes none = { NULL, 0 };

	return efs_fw_save(fw, j, b, none, none);
}

void efs_fw_process(efs_fw *fw, const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n,
	efs_result *r)
{
	step_ctx x;
	efs_hook h = { hook_check, hook_step, NULL };

	memset(&x, 0, sizeof x);
	x.fw = fw;
	h.user = &x;
	fw->last = EFS_FW_OK;
	efs_process_hooked(fw->fence, device, device_len, buf, n, r, &h);
	fw->other = (uint8_t)x.other;
	if (x.wrote && !r->apply) {
		fw->broken = 1; /* the record moved, the mark did not: efs_fw_open rolls it forward */
		return;
	}
	if (r->apply && fw->job.state == EFS_FW_INSTALLING) { /* the device's own part (fwjob's Settle) */
		settle(fw->port, &fw->job);
		if (save_same(fw, &fw->job, &fw->boot) != EFS_OK) {
			fw->broken = 1; /* installing stays on flash: efs_fw_open and efs_fw_boot settle it */
		}
	}
}

efs_err efs_fw_open(efs_fw *fw, const efs_fw_port *port, efs_ctx *fence)
{
	efs_mark_record tag;
	efs_err e;

	memset(fw, 0, sizeof *fw);
	fw->port = port;
	fw->fence = fence;
	if ((e = efs_fw_load(fw, &tag)) != EFS_OK) {
		fw->broken = 1;
		return e;
	}
	if (fw->cur < 0 || fence->corrupt) {
		return EFS_OK;
	}
	/* A tag above the mark (by epoch, then mark) is a step whose mark
	 * write was cut, if no operator's reset came since (the record's
	 * counter is the mark's): a reset is one mark write and leaves the
	 * record as it is, its tag behind, never rolled forward over the
	 * reset's mark; nor is a tag of an earlier epoch than a mark accepted
	 * since (the application's, port.other). */
	if (fw->job.counter == fence->reset_counter &&
		(tag.epoch > fence->epoch ||
			(tag.epoch == fence->epoch &&
				(tag.mark.token > fence->mark.token ||
					(tag.mark.token == fence->mark.token && tag.mark.seq > fence->mark.seq))))) {
		efs_bytes holder = { tag.holder, tag.holder_len }, id = { tag.id, tag.id_len };
		if (efs_store(fence, &tag.mark, tag.epoch, &holder, &id) != EFS_OK) { /* the step happened: its mark too */
			fw->broken = 1;
			return EFS_E_STORAGE;
		}
	}
	return EFS_OK;
}

/* factory is the first boot's state: slot A holds the factory image. */
static efs_err factory(efs_fw *fw, efs_fw_job *j, efs_fw_boot_state *b)
{
	const efs_fw_port *port = fw->port;

	memset(j, 0, sizeof *j);
	memset(b, 0, sizeof *b);
	b->trial = EFS_FW_NO_SLOT;
	b->security = port->factory_security;
	b->active_size = port->factory_size;
	if (port->factory_size > port->slot_size ||
		efs_fw_hash_slot(port, 0, port->factory_size, b->active_image) != 0) {
		return EFS_E_STORAGE;
	}
	return EFS_OK;
}

/* pick is the boot loader's choice (fwjob's loadForBoot): the active slot,
 * or the armed trial if it verifies and has tries left (one spent). */
static void pick(const efs_fw_port *port, efs_fw_job *j, efs_fw_boot_state *b)
{
	char why[EFS_FW_MAX_REASON + 1];
	efs_fw_text t = { why, sizeof why, 0 };

	b->boots++;
	b->running = b->active;
	if (b->trial == EFS_FW_NO_SLOT) {
		return;
	}
	if (b->tries == 0) {
		disarm(j, b, "trial boots exhausted: the new image never confirmed", "");
		return;
	}
	if (!verify_slot(port, b->trial, b->trial_size, b->trial_image, &t)) {
		disarm(j, b, "trial boot refused: ", why);
		return;
	}
	b->tries--;
	b->running = b->trial;
}

efs_err efs_fw_boot(efs_fw *fw, efs_fw_boot_info *info)
{
	efs_fw_job j = fw->job;
	efs_fw_boot_state b = fw->boot;
	efs_err e;

	memset(info, 0, sizeof *info);
	if (fw->broken) {
		return EFS_E_STORAGE;
	}
	if (fw->cur < 0 && (e = factory(fw, &j, &b)) != EFS_OK) {
		return e;
	}
	settle(fw->port, &j);
	pick(fw->port, &j, &b);
	if ((e = save_same(fw, &j, &b)) != EFS_OK) { /* the try is spent before the image runs */
		return e;
	}
	info->slot = b.running;
	info->trial = b.trial != EFS_FW_NO_SLOT && b.running == b.trial;
	memcpy(info->image, info->trial ? b.trial_image : b.active_image, 32);
	info->size = info->trial ? b.trial_size : b.active_size;
	return EFS_OK;
}

efs_err efs_fw_health(efs_fw *fw, int healthy, const char *reason)
{
	efs_fw_job j = fw->job;
	efs_fw_boot_state b = fw->boot;

	if (fw->broken || fw->cur < 0 || b.trial == EFS_FW_NO_SLOT || b.running != b.trial) {
		return EFS_E_STORAGE; /* no trial is running */
	}
	if (!healthy) {
		disarm(&j, &b, "health check failed: ", reason != NULL ? reason : "unhealthy");
		b.running = b.active;
	} else if (j.state == EFS_FW_REBOOTING) {
		j.state = EFS_FW_CONFIRMING;
	}
	return save_same(fw, &j, &b);
}

int efs_fw_reboot_pending(const efs_fw *fw)
{
	uint8_t next = fw->boot.trial != EFS_FW_NO_SLOT ? fw->boot.trial : fw->boot.active;

	return fw->cur >= 0 && next != fw->boot.running;
}
