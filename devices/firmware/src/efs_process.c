/*
 * The fence point: devices/shim's Handle in C. Screen (the addressed
 * device, the envelope, the device it names), admit (the epoch first),
 * store the new mark in its epoch, then let the caller apply. The acks are
 * devices/shim's, reasons included for stale and duplicate commands and
 * for refusals by epoch; another Invalid ack's reason is this library's
 * own (efs_strerror), not Go's error text.
 */
#include <string.h>

#include "efs_internal.h"

/* efs_text_add copies s to buf (cap bytes) at *at, always NUL-terminated. */
void efs_text_add(char *buf, size_t cap, size_t *at, const char *s)
{
	while (*s != '\0' && *at + 1 < cap) {
		buf[(*at)++] = *s++;
	}
	buf[*at] = '\0';
}

static void append(efs_result *r, size_t *at, const char *s)
{
	efs_text_add(r->reason, sizeof r->reason, at, s);
}

/* div10 divides *v by 10 and returns the remainder: long division in
 * 16-bit digits, so that only 32-bit division is needed (a Cortex-M has it
 * in hardware; libgcc's 64-bit division would add 700 bytes of flash). */
static unsigned div10(uint64_t *v)
{
	uint64_t q = 0;
	uint32_t rem = 0;

	for (int shift = 48; shift >= 0; shift -= 16) {
		uint32_t cur = rem << 16 | (uint32_t)((*v >> shift) & 0xffffu);

		q |= (uint64_t)(cur / 10u) << shift;
		rem = cur % 10u;
	}
	*v = q;
	return rem;
}

/* efs_text_u64 writes v in decimal to buf (cap bytes) at *at. */
void efs_text_u64(char *buf, size_t cap, size_t *at, uint64_t v)
{
	char d[21];
	int i = 20;

	d[i] = '\0';
	do {
		d[--i] = (char)('0' + div10(&v));
	} while (v != 0);
	efs_text_add(buf, cap, at, d + i);
}

static void append_u64(efs_result *r, size_t *at, uint64_t v)
{
	efs_text_u64(r->reason, sizeof r->reason, at, v);
}

uint64_t efs_own_epoch(const efs_ctx *c)
{
	const efs_port *p = c->port;
	uint64_t e = p->verify != NULL && p->epoch != NULL ? p->epoch(p->user) : 0;

	return e > c->reset_epoch ? e : c->reset_epoch;
}

efs_state efs_state_of(const efs_ctx *c)
{
	efs_state st = { c->epoch, c->mark };

	return efs_at(st, efs_own_epoch(c));
}

EFS_NOINLINE void efs_state_now(const efs_ctx *c, efs_result *r)
{
	efs_state st = efs_state_of(c);

	r->mark = st.mark;
	r->epoch = st.epoch;
}

/* epoch_reason writes the reason of a refusal by epoch (fence.EpochError)
 * of a command of epoch at a device of epoch r->epoch. */
static EFS_NOINLINE void epoch_reason(efs_result *r, uint64_t epoch)
{
	size_t at = 0;

	append(r, &at, epoch < r->epoch ? "epoch " : "unknown epoch ");
	append_u64(r, &at, epoch);
	append(r, &at, epoch < r->epoch ? " closed: the fence point is at epoch " : ": the fence point is at epoch ");
	append_u64(r, &at, r->epoch);
}

static void append_mark(efs_result *r, size_t *at, efs_mark m)
{
	append_u64(r, at, m.token);
	append(r, at, "/");
	append_u64(r, at, m.seq);
}

static void refuse(efs_result *r, efs_err e)
{
	size_t at = 0;

	r->verdict = EFS_INVALID;
	r->err = e;
	r->apply = 0;
	append(r, &at, efs_strerror(e));
}

/* claimed sets r->env to the envelope a refused signed command claims to
 * be, signed (unverified) or plain, if it names device: only to address
 * the refusal's ack (fence/auth's Claimed), never to act on. */
static void claimed(const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n, efs_result *r)
{
	efs_signed s;

	if (efs_decode_signed(buf, n, &s, &r->env) != EFS_OK && efs_decode_envelope(buf, n, &r->env) != EFS_OK) {
		memset(&r->env, 0, sizeof r->env);
		return;
	}
	if (efs_bytes_equal(r->env.device.p, r->env.device.n, device, device_len)) {
		r->decoded = 1;
	} else {
		memset(&r->env, 0, sizeof r->env);
	}
}

/* decode decodes buf into r->env: verified if the port verifies (then
 * only signed commands are accepted), plain otherwise. */
static efs_err decode(const efs_ctx *c, const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n,
	efs_result *r)
{
	efs_signed s;
	efs_err e;

	if (c->port->verify == NULL) {
		e = efs_decode_envelope(buf, n, &r->env);
		if (e != EFS_OK) {
			memset(&r->env, 0, sizeof r->env);
		}
		return e;
	}
	e = efs_verify_signed(c->port, buf, n, &s, &r->env);
	if (e != EFS_OK) {
		claimed(device, device_len, buf, n, r);
	}
	return e;
}

void efs_process(efs_ctx *c, const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n,
	efs_result *r)
{
	efs_process_hooked(c, device, device_len, buf, n, r, NULL);
}

/* check_hooks runs the port's check and the hook's: 0 to go on. */
static int check_hooks(const efs_ctx *c, efs_result *r, const efs_hook *h)
{
	const char *why = NULL;
	size_t at = 0;
	int refused = 0;

	if (c->port->check != NULL) {
		refused = c->port->check(c->port->user, &r->env, &why) != 0;
	}
	if (!refused && h != NULL && h->check != NULL) {
		refused = h->check(h->user, r) != 0;
		if (refused) {
			r->verdict = EFS_INVALID;
			r->err = EFS_E_CHECK;
			return 1; /* the hook wrote its reason */
		}
	}
	if (refused) {
		refuse(r, EFS_E_CHECK);
		if (why != NULL) {
			append(r, &at, why);
		}
	}
	return refused;
}

void efs_process_hooked(efs_ctx *c, const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n,
	efs_result *r, const efs_hook *h)
{
	efs_err e;
	size_t at = 0;

	memset(r, 0, sizeof *r);
	if (!efs_valid_device_id(device, device_len)) {
		refuse(r, EFS_E_ADDRESSED);
		return;
	}
	efs_state_now(c, r); /* the ack of a refusal carries it */
	r->device.p = device;
	r->device.n = device_len;
	if ((e = decode(c, device, device_len, buf, n, r)) != EFS_OK) {
		refuse(r, e);
		return;
	}
	r->decoded = 1;
	if (!efs_bytes_equal(r->env.device.p, r->env.device.n, device, device_len)) {
		refuse(r, EFS_E_WRONG_DEVICE);
		return;
	}
	if (check_hooks(c, r, h)) {
		return;
	}
	if (c->corrupt) { /* as devices/shim: a mark it cannot read refuses, with no state */
		r->mark.token = r->mark.seq = 0;
		r->epoch = 0;
		refuse(r, EFS_E_CORRUPT);
		return;
	}
	/* efs_admit_epoch at the device's state (r's: efs_state_of is its
	 * State.At): the epoch, then the mark accepted in it */
	if (r->env.epoch != r->epoch) { /* its epoch is closed, or unknown here */
		r->verdict = r->env.epoch < r->epoch ? EFS_STALE : EFS_INVALID;
		r->err = r->verdict == EFS_INVALID ? EFS_E_UNKNOWN_EPOCH : EFS_OK;
		epoch_reason(r, r->env.epoch);
		return;
	}
	r->verdict = efs_admit(r->mark, r->env.token, r->env.seq, &r->mark);
	switch (r->verdict) {
	case EFS_STALE: /* the mark unchanged */
		append(r, &at, "token ");
		append_u64(r, &at, r->env.token);
		append(r, &at, " below the high-water mark ");
		append_mark(r, &at, r->mark);
		return;
	case EFS_DUPLICATE:
		append(r, &at, "already applied: ");
		append_u64(r, &at, r->env.token);
		append(r, &at, "/");
		append_u64(r, &at, r->env.seq);
		append(r, &at, " not above ");
		append_mark(r, &at, r->mark);
		return;
	case EFS_ACCEPTED:
		break;
	default: /* validation refused token 0 and seq 0 already */
		refuse(r, EFS_E_TOKEN_ZERO);
		return;
	}
	if (h != NULL && h->step != NULL && h->step(h->user, r) != 0) {
		r->verdict = EFS_INVALID; /* the hook wrote its reason; nothing moved */
		r->err = EFS_E_CHECK;
		efs_state_now(c, r);
		return;
	}
	if (efs_store(c, &r->mark, r->epoch, &r->env.holder, &r->env.id) != EFS_OK) {
		efs_state_now(c, r); /* unchanged; or the new one, if only the older slot's marking failed */
		refuse(r, EFS_E_STORAGE);
		return;
	}
	r->apply = 1; /* durable: the caller may apply now */
}

void efs_result_ack(const efs_result *r, efs_ack *a)
{
	memset(a, 0, sizeof *a);
	a->device = r->device;
	a->verdict = r->verdict;
	a->mark = r->mark;
	a->epoch = r->epoch;
	a->reason.p = (const uint8_t *)r->reason;
	while (r->reason[a->reason.n] != '\0') {
		a->reason.n++;
	}
	if (r->decoded) {
		a->id = r->env.id;
		a->token = r->env.token;
		a->seq = r->env.seq;
	}
}
