/*
 * efsdev: a thermostat device in C on libmosquitto, fenced by the efshim
 * library: the Linux/MQTT integration of devices/firmware, and the device
 * the Figure 1 and kill -9 tests run in place of edgefence-devsim.
 *
 *   efsdev --mqtt mqtt://127.0.0.1:1883 --devices dev-1,dev-2 --dir DIR
 *          [--prefix edgefence/v1] [--log verdicts.jsonl] [--client-id ID]
 *          [--mqtt-user U (password from $EDGEFENCE_MQTT_PASSWORD or
 *          --mqtt-password-file F)] [--history FILE [--history-source SRC]]
 *          [--trust-root PUB --trust-root-kid KID [--certs F,F...]
 *           [--revocations F] [--epoch F] [--device-keys DIR]]
 *          [--reset-root PUB --trust-root-kid KID]
 *
 * Topics, QoS and payloads are devsim's (devices/sim.Fleet): commands at
 * QoS 1 on <prefix>/dev/<id>/cmd (MQTT v5, a persistent session), acks
 * (fence.MarshalAck's bytes, from efs_encode_ack) at QoS 1 on the command's
 * response topic or <prefix>/dev/<id>/ack with its correlation data, the
 * state (sim.State's CBOR map) on <prefix>/dev/<id>/state after a command
 * is applied. Verdicts go to --log as sim.VerdictRecord JSON lines. Each
 * device keeps its mark in <dir>/<id>.flash (two sectors: flash_file.c)
 * and its state in <dir>/<id>.state (thermostat.c's journal). Logs go to
 * stderr as key=value lines; msg=ready once every subscription is granted.
 * --history appends fence/history events (accepts before the mark's commit,
 * with the signer's kid when signed; an "opened" event with the durable mark
 * per device at start; a "trust" event naming the revoked kids after each
 * newer revocation list is stored).
 *
 * With --trust-root every command must be signed by a gateway the operator
 * certified for the device (the library's efs_verify_signed, the key store
 * of trust.c); trust updates on the cmd topic add certificates, revocation
 * lists and the fleet's epoch statement (kept in <dir>/trust.cbor, no ack;
 * --epoch provisions one at start): the library's port.epoch, so a command
 * of an earlier epoch is refused stale, one of a later invalid. With --device-keys
 * (<id>.key, <id>.cert: edgefence keys enrol) acks and state reports are
 * signed by the device's key (fence/auth's VerifyAck and VerifyState).
 *
 * The operator's resets (edgefence fence reset) are checked against the
 * root of --trust-root, or of --reset-root while commands stay plain (as
 * devsim's flags); the library writes the mark, the reset counter and the
 * reset's epoch in one flash record before the ack says accepted: no
 * command of an earlier epoch is admitted after it. Without either every
 * reset is refused. Acks carry the device's epoch (fence.Ack key 10).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <mosquitto.h>
#include <mqtt_protocol.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "efsdev.h"

#define MAX_DEVICES 64
#define SESSION_EXPIRY 300 /* seconds, the transport's default */

typedef struct {
	char id[EFS_MAX_DEVICE_ID_LEN + 1];
	char cmd[512], ack[512], state[512];
	efsdev_flash flash;
	efs_port port;
	efs_ctx ctx;
	efs_mark mark; /* the mark on flash (kept in step with ctx's) */
	int corrupt;   /* the stored mark is unreadable: efs_process refuses everything */
	efsdev_journal journal;
	efsdev_signer signer; /* --device-keys: signs acks and state reports */
	efsdev_fw_dev *fw;    /* --firmware: the firmware job (efsdev_fw.c), else NULL */
	int sub_mid;          /* the mid of the command topic's SUBSCRIBE in flight */
	int sub_tries;        /* SUBSCRIBEs of the command topic on this connection */
} device;

typedef struct {
	const char *broker, *prefix, *dir, *log, *client_id, *user, *pass_file, *devices, *history, *history_source;
	const char *trust_root, *trust_root_kid, *certs, *revocations, *epoch, *device_keys, *reset_root;
	const char *firmware, *fw_window, *fw_tries, *fw_security, *fw_max_image, *fw_status;
} options;

static device devs[MAX_DEVICES];
static int ndev, granted, ready_logged, vlog_fd = 1, hist_fd = -1;
static const char *hist_source = "efsdev";
static const char *prefix = "edgefence/v1";
static unsigned long counts[5];
static volatile sig_atomic_t stopping;
static efsdev_trust trust;     /* --trust-root: commands must be signed */
static efs_bytes hist_signer;  /* the verified signer's kid of the accept take records (history "kid") */
static uint64_t hist_listed;   /* version of the revocation list last recorded in the history ("trust") */
static uint64_t hist_epoch;    /* the fleet epoch last recorded in the history ("epoch") */
static int trusted;
static efsdev_trust reset_trust; /* --reset-root: resets, commands plain */
static uint64_t report_counter; /* state reports: the start time in ns, +1 per report (as devsim) */
static unsigned long trust_counts[3]; /* statements applied, held; updates refused */

static int fw_mode;                   /* --firmware: one device, its firmware job */
static efsdev_fw_opts fw_opts;
static volatile int reboot_requested; /* a command asked for a reboot: exit 3 once its publishes are out */
static int inflight;                  /* QoS 1 publishes not yet acknowledged */

static const char content_ack[] = "application/edgefence-ack+cbor";
static const char content_state[] = "application/edgefence-state+cbor";

static void logf_(const char *level, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n = snprintf(buf, sizeof buf, "level=%s ", level);

	va_start(ap, fmt);
	vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", buf);
	fflush(stderr);
}

static void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

static int check(void *user, const efs_envelope *env, const char **reason)
{
	efsdev_changes c;

	(void)user;
	return efsdev_parse(env, &c, reason);
}

static int sha256(void *user, const efs_bytes *parts, size_t n, uint8_t digest[32])
{
	(void)user;
	return efsdev_sha256(NULL, parts, n, digest);
}

/* fleet_epoch is port.epoch: the newest epoch statement the trust holds. */
static uint64_t fleet_epoch(void *user)
{
	(void)user;
	return trust.epoch;
}

/* verify_root checks a reset's signature with --reset-root's key, else
 * --trust-root's. */
static int verify_root(void *user, const uint8_t *kid, size_t kid_len, const uint8_t digest[32], const uint8_t sig[64])
{
	(void)user;
	return efsdev_verify_root(reset_trust.root_loaded ? &reset_trust : &trust, kid, kid_len, digest, sig);
}

/* The verdict of the last signature checked, kept from take's verify to
 * efs_process's of the same message (handle clears it before and after):
 * one ECDSA verify per command, not two. The digest covers the whole
 * signed command, so a hit is the same bytes, checked against the same
 * store (nothing changes it in between). */
static struct {
	int valid, result;
	uint8_t kid[EFS_MAX_KEY_ID], device[EFS_MAX_DEVICE_ID_LEN], digest[32], sig[64];
	size_t kid_len, device_len;
} last_verify;

static int verify(void *user, const uint8_t *kid, size_t kid_len, const uint8_t *device, size_t device_len,
	const uint8_t digest[32], const uint8_t sig[64])
{
	(void)user; /* the flash's: the key store is the process's */
	if (last_verify.valid && kid_len == last_verify.kid_len && device_len == last_verify.device_len &&
	    memcmp(kid, last_verify.kid, kid_len) == 0 && memcmp(device, last_verify.device, device_len) == 0 &&
	    memcmp(digest, last_verify.digest, 32) == 0 && memcmp(sig, last_verify.sig, 64) == 0) {
		last_verify.valid = 0;
		return last_verify.result;
	}
	last_verify.result = efsdev_verify(&trust, kid, kid_len, device, device_len, digest, sig);
	if (kid_len <= sizeof last_verify.kid && device_len <= sizeof last_verify.device) {
		memcpy(last_verify.kid, kid, kid_len);
		memcpy(last_verify.device, device, device_len);
		memcpy(last_verify.digest, digest, 32);
		memcpy(last_verify.sig, sig, 64);
		last_verify.kid_len = kid_len;
		last_verify.device_len = device_len;
		last_verify.valid = 1;
	}
	return last_verify.result;
}

static void state_json(char *out, size_t cap, size_t *at, const efsdev_state *s)
{
	*at += (size_t)snprintf(out + *at, cap - *at, "{\"setpoint\":%.17g,\"mode\":\"%s\",\"relay\":%s,\"applied\":%llu,"
		"\"last_token\":%llu,\"last_seq\":%llu,\"last_id\":", s->setpoint, efsdev_modes[s->mode & 3],
		s->relay ? "true" : "false", (unsigned long long)s->applied, (unsigned long long)s->last_token,
		(unsigned long long)s->last_seq);
	efsdev_json_string(out, cap, at, s->last_id, s->last_id_len);
	out[(*at)++] = '}';
}

static const char *verdict_name(efs_verdict v)
{
	static const char *const names[] = {"", "accepted", "duplicate", "stale", "invalid"};
	return (int)v >= 1 && (int)v <= 4 ? names[v] : "invalid";
}

/* json_time appends {"<key>":"<now, RFC 3339 with nanoseconds, UTC>" to out. */
static size_t json_time(char *out, size_t cap, const char *key)
{
	struct timespec ts;
	struct tm tm;
	size_t at;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	at = (size_t)snprintf(out, cap, "{\"%s\":\"", key);
	at += strftime(out + at, cap - at, "%Y-%m-%dT%H:%M:%S", &tm);
	at += (size_t)snprintf(out + at, cap - at, ".%09ldZ\"", ts.tv_nsec);
	return at;
}

/* json_field appends ,"<key>":<s as a JSON string>; with omit, nothing for
 * an empty s (Go's omitempty). */
static void json_field(char *out, size_t cap, size_t *at, const char *key, const void *s, size_t n, int omit)
{
	if (omit && n == 0) {
		return;
	}
	*at += (size_t)snprintf(out + *at, cap - *at, ",\"%s\":", key);
	efsdev_json_string(out, cap, at, s, n);
}

/* history_event appends one fence/history event (history.Event's JSON) to
 * --history, in one write(2): op "verdict" with the verdict and the
 * command's epoch, "opened" with the durable mark and its epoch, or
 * "epoch" with a reset's id, mark and epoch. */
static void history_event(const device *d, const char *op, const efs_bytes *id, uint64_t epoch, uint64_t token, uint64_t seq,
	const efs_bytes *kind, const char *verdict, const char *reason, const efs_envelope *env)
{
	char line[2048];
	size_t at;

	if (hist_fd < 0) {
		return;
	}
	at = json_time(line, sizeof line, "t");
	json_field(line, sizeof line, &at, "src", hist_source, strlen(hist_source), 0);
	json_field(line, sizeof line, &at, "op", op, strlen(op), 0);
	json_field(line, sizeof line, &at, "dev", d->id, strlen(d->id), 0);
	json_field(line, sizeof line, &at, "id", id ? id->p : NULL, id ? id->n : 0, 0);
	at += (size_t)snprintf(line + at, sizeof line - at, ",\"token\":%llu,\"seq\":%llu", (unsigned long long)token,
		(unsigned long long)seq);
	json_field(line, sizeof line, &at, "kind", kind ? kind->p : NULL, kind ? kind->n : 0, 1);
	json_field(line, sizeof line, &at, "verdict", verdict, verdict ? strlen(verdict) : 0, 1);
	json_field(line, sizeof line, &at, "reason", reason, reason ? strlen(reason) : 0, 1);
	json_field(line, sizeof line, &at, "kid", (const char *)hist_signer.p, hist_signer.n, 1);
	if (epoch != 0) { /* omitempty */
		at += (size_t)snprintf(line + at, sizeof line - at, ",\"epoch\":%llu", (unsigned long long)epoch);
	}
	if (env != NULL && d->fw != NULL) { /* fwjob.NoteHistory: a firmware step's job and image */
		char job[EFS_FW_MAX_JOB + 1], image[65];

		efsdev_fw_note(env, job, image);
		json_field(line, sizeof line, &at, "job", job, strlen(job), 1);
		json_field(line, sizeof line, &at, "image", image, strlen(image), 1);
	}
	line[at++] = '}';
	line[at++] = '\n';
	if (write(hist_fd, line, at) != (ssize_t)at) {
		logf_("WARN", "msg=\"history not written\" device=%s err=\"%s\"", d->id, strerror(errno));
	}
}

/* log_verdict appends r as one sim.VerdictRecord line, in one write. */
static void log_verdict(const device *d, const efs_result *r)
{
	char line[4096];
	size_t at = json_time(line, sizeof line, "time");
	const efs_envelope *e = &r->env;
	int dec = r->decoded;

	memcpy(line + at, ",\"device\":", 10);
	at += 10;
	efsdev_json_string(line, sizeof line, &at, d ? d->id : (const char *)r->device.p, d ? strlen(d->id) : r->device.n);
	at += (size_t)snprintf(line + at, sizeof line - at, ",\"token\":%llu,\"seq\":%llu,\"id\":",
		(unsigned long long)(dec ? e->token : 0), (unsigned long long)(dec ? e->seq : 0));
	efsdev_json_string(line, sizeof line, &at, (const char *)e->id.p, dec ? e->id.n : 0);
	line[at++] = ',';
	memcpy(line + at, "\"kind\":", 7);
	at += 7;
	efsdev_json_string(line, sizeof line, &at, (const char *)e->kind.p, dec ? e->kind.n : 0);
	memcpy(line + at, ",\"holder\":", 10);
	at += 10;
	efsdev_json_string(line, sizeof line, &at, (const char *)e->holder.p, dec ? e->holder.n : 0);
	at += (size_t)snprintf(line + at, sizeof line - at, ",\"verdict\":\"%s\",\"max_token\":%llu,\"last_seq\":%llu",
		verdict_name(r->verdict), (unsigned long long)r->mark.token, (unsigned long long)r->mark.seq);
	if (r->epoch != 0) { /* omitempty, as sim.VerdictRecord's */
		at += (size_t)snprintf(line + at, sizeof line - at, ",\"epoch\":%llu", (unsigned long long)r->epoch);
	}
	memcpy(line + at, ",\"reason\":", 10);
	at += 10;
	efsdev_json_string(line, sizeof line, &at, r->reason, strlen(r->reason));
	memcpy(line + at, ",\"state\":", 9);
	at += 9;
	if (d != NULL) {
		state_json(line, sizeof line, &at, &d->journal.rec.state);
	} else {
		memcpy(line + at, "null", 4);
		at += 4;
	}
	line[at++] = '}';
	line[at++] = '\n';
	if (write(vlog_fd, line, at) != (ssize_t)at) {
		logf_("ERROR", "msg=\"verdict log\" err=\"%s\"", strerror(errno));
	}
}

/* response_topic_ok is devsim's responseTopicOK: a plain topic name, not
 * into the devices' tree but this device's own ack topic. */
static int response_topic_ok(const device *d, const char *rt)
{
	char tree[512];

	if (strpbrk(rt, "+#") != NULL || rt[0] == '$' || strlen(rt) > 65535) {
		return 0;
	}
	snprintf(tree, sizeof tree, "%s/dev/", prefix);
	return strncmp(rt, tree, strlen(tree)) != 0 || strcmp(rt, d->ack) == 0;
}

/* take journals the command in msg before efs_process can move the mark,
 * if it is one the device will accept: after a kill between the mark's
 * write and the state's, the restart applies it (recover). It records the
 * accept in the history then, before the commit, as devices/shim does, and
 * sets *accepting. 0: go on. */
static int take(device *d, const uint8_t *msg, size_t n, int *accepting)
{
	efs_envelope env;
	efs_signed sg;
	efsdev_changes c;
	efs_state st = efs_state_of(&d->ctx), next;
	const char *reason;
	efsdev_journal_rec *j = &d->journal.rec;
	/* signed: verified here, so that no forgery is ever journalled;
	 * efs_process's verify of the same bytes then hits last_verify */
	efs_err e = trusted ? efs_verify_signed(&d->port, msg, n, &sg, &env) : efs_decode_envelope(msg, n, &env);

	if (d->corrupt || e != EFS_OK || env.device.n != strlen(d->id) ||
	    memcmp(env.device.p, d->id, env.device.n) != 0 || efsdev_parse(&env, &c, &reason) != 0 ||
	    efs_admit_epoch(st.epoch, st, env.epoch, env.token, env.seq, &next) != EFS_ACCEPTED) {
		*accepting = 0;
		return 0; /* efs_process refuses it, or acks a duplicate: no effect */
	}
	j->pending = 1;
	j->p_token = env.token;
	j->p_seq = env.seq;
	j->p_id_len = (uint8_t)env.id.n;
	memcpy(j->p_id, env.id.p, env.id.n);
	j->p_changes = c;
	if (efsdev_journal_write(&d->journal) != 0) {
		logf_("ERROR", "msg=\"state journal not written; command not taken (no ack: the agent retries)\" device=%s err=\"%s\"",
			d->id, strerror(errno));
		return -1;
	}
	*accepting = 1;
	if (trusted) {
		hist_signer = sg.kid; /* verified above */
	}
	history_event(d, "verdict", &env.id, env.epoch, env.token, env.seq, &env.kind, "accepted", NULL, &env);
	hist_signer.n = 0;
	return 0;
}

/* revoked_kid appends one key id to a history line's "revoked" array. */
typedef struct {
	char *out;
	size_t cap, *at;
	int n, full;
} kid_list;

static void revoked_kid(void *user, const uint8_t *kid, size_t n)
{
	kid_list *l = user;

	if (l->full || *l->at + 1 + 12 * n + 3 > l->cap) { /* efsdev_json_string's worst case */
		l->full = 1;
		return;
	}
	if (l->n++ > 0) {
		l->out[(*l->at)++] = ',';
	}
	efsdev_json_string(l->out, l->cap, l->at, (const char *)kid, n);
}

/* history_trust records the revocation list in effect (history.OpTrust:
 * its key ids), after its commit, if it is newer than the last one
 * recorded, as devices/shim does. */
static void history_trust(const device *d)
{
	char line[8192], why[64];
	size_t at;
	kid_list l = {line, sizeof line - 3, &at, 0, 0};

	if (hist_fd < 0 || trust.rev_raw == NULL || trust.rev_version <= hist_listed) {
		return;
	}
	at = json_time(line, sizeof line, "t");
	json_field(line, sizeof line, &at, "src", hist_source, strlen(hist_source), 0);
	json_field(line, sizeof line, &at, "op", "trust", 5, 0);
	json_field(line, sizeof line, &at, "dev", d->id, strlen(d->id), 0);
	snprintf(why, sizeof why, "revocation list version %llu", (unsigned long long)trust.rev_version);
	json_field(line, sizeof line, &at, "reason", why, strlen(why), 1);
	at += (size_t)snprintf(line + at, sizeof line - at, ",\"revoked\":[");
	if (efsdev_trust_revoked_kids(&trust, revoked_kid, &l) != 0 || l.full) {
		logf_("WARN", "msg=\"history: revocation list not recorded\" device=%s", d->id);
		return;
	}
	line[at++] = ']';
	line[at++] = '}';
	line[at++] = '\n';
	if (write(hist_fd, line, at) != (ssize_t)at) {
		logf_("WARN", "msg=\"history not written\" device=%s err=\"%s\"", d->id, strerror(errno));
		return;
	}
	hist_listed = trust.rev_version;
}

/* history_fleet_epoch records the epoch of the root's epoch statement the
 * trust holds — every device's lowest epoch here — (history.OpEpoch, no
 * device), after its commit, if it is above the last one recorded, as
 * devices/shim does. */
static void history_fleet_epoch(void)
{
	char line[512];
	size_t at;
	const char *why = "the root's epoch statement";

	if (hist_fd < 0 || !trusted || trust.epoch <= hist_epoch) {
		return;
	}
	at = json_time(line, sizeof line, "t");
	json_field(line, sizeof line, &at, "src", hist_source, strlen(hist_source), 0);
	json_field(line, sizeof line, &at, "op", "epoch", 5, 0);
	json_field(line, sizeof line, &at, "reason", why, strlen(why), 1);
	at += (size_t)snprintf(line + at, sizeof line - at, ",\"epoch\":%llu}\n", (unsigned long long)trust.epoch);
	if (write(hist_fd, line, at) != (ssize_t)at) {
		logf_("WARN", "msg=\"history not written\" err=\"%s\"", strerror(errno));
		return;
	}
	hist_epoch = trust.epoch;
}

/* record_decision writes r to the history unless take recorded it: a
 * refusal, a duplicate, or (an accept take foresaw that did not happen: the
 * mark's write failed) the durable mark, so the checker drops that accept. */
static void record_decision(const device *d, const efs_result *r, int accepting)
{
	const efs_envelope *e = &r->env;

	if (accepting && r->verdict == EFS_ACCEPTED) {
		return;
	}
	if (accepting) {
		history_event(d, "opened", NULL, d->ctx.epoch, d->mark.token, d->mark.seq, NULL, NULL, "the mark's write failed", NULL);
	}
	history_event(d, "verdict", r->decoded ? &e->id : NULL, r->decoded ? e->epoch : 0, r->decoded ? e->token : 0, r->decoded ? e->seq : 0,
		r->decoded ? &e->kind : NULL, verdict_name(r->verdict), r->reason, r->decoded ? e : NULL);
}

static void publish(struct mosquitto *m, const char *topic, const void *p, size_t n, const mosquitto_property *in,
	int retain)
{
	mosquitto_property *props = NULL;
	void *corr = NULL;
	uint16_t clen = 0;
	int rc;

	if (in != NULL && mosquitto_property_read_binary(in, MQTT_PROP_CORRELATION_DATA, &corr, &clen, false) != NULL) {
		mosquitto_property_add_binary(&props, MQTT_PROP_CORRELATION_DATA, corr, clen);
	}
	rc = mosquitto_publish_v5(m, NULL, topic, (int)n, p, 1, retain != 0, props);
	if (rc == MOSQ_ERR_SUCCESS) {
		inflight++;
	} else {
		logf_("WARN", "msg=\"not published\" topic=%s err=\"%s\"", topic, mosquitto_strerror(rc));
	}
	mosquitto_property_free_all(&props);
	free(corr);
}

#ifdef EFSDEV_FAILPOINTS
/* kill_after_mark is the test build's failpoint (-DEFSDEV_FAILPOINTS, as
 * BuildCDevice's sanitized build): with EFSDEV_KILL_AFTER_MARK=N the
 * process kills itself (SIGKILL) after the Nth mark it wrote, before the
 * command's effect reaches the state journal. */
static void kill_after_mark(void)
{
	static long n;
	const char *v = getenv("EFSDEV_KILL_AFTER_MARK");

	if (v != NULL && ++n == atol(v)) {
		logf_("INFO", "msg=\"failpoint: SIGKILL after the mark's write\" n=%ld", n);
		raise(SIGKILL);
	}
}
#else
static void kill_after_mark(void) {}
#endif

/* sign turns the payload in buf (n bytes) into its signed form in place
 * if the device has a key: the new length, 0 on failure; n without a key. */
static size_t sign(device *d, const char *ctype, uint8_t *buf, size_t n)
{
	uint8_t out[EFSDEV_MAX_SIGNED_ACK];
	size_t sn;

	if (!d->signer.ready) {
		return n;
	}
	if ((sn = efsdev_sign(&d->signer, ctype, buf, n, out, sizeof out)) == 0 || sn > EFSDEV_MAX_SIGNED_ACK) {
		return 0;
	}
	memcpy(buf, out, sn);
	return sn;
}

/* state_report writes the device's state as it reports it: sim.State's map,
 * or with a key an auth.StateReport under mark m in the device's epoch,
 * signed. */
static size_t state_report(device *d, efs_mark m, uint8_t *out, size_t cap)
{
	efs_state s = efs_state_of(&d->ctx);
	uint8_t st[2048];
	size_t sn = d->fw != NULL ? efsdev_fw_report(d->fw, &d->journal.rec.state, st, sizeof st)
				  : efsdev_state_cbor(&d->journal.rec.state, st, sizeof st);

	if (sn == 0 || !d->signer.ready) {
		memcpy(out, st, sn <= cap ? sn : 0);
		return sn <= cap ? sn : 0;
	}
	s.mark = m;
	if ((sn = efsdev_state_report(d->id, s, ++report_counter, st, sn, out, cap)) == 0) {
		return 0;
	}
	return sign(d, content_state, out, sn);
}

/* take_update takes a trust update from the cmd topic: stored before it
 * counts; refused whole if any statement is not the root's. */
static void take_update(const device *d, const uint8_t *msg, size_t n)
{
	efsdev_trust_counts c;
	const char *why = "";
	int rc = efsdev_trust_update(&trust, msg, n, 1, &c, &why);

	if (rc == -2) {
		logf_("ERROR", "msg=\"trust store not written: stopping (the update is not kept; a restart reads the store)\" device=%s err=\"%s\"",
			d->id, strerror(errno));
		_exit(1);
	}
	if (rc != 0) {
		trust_counts[2]++;
		logf_("WARN", "msg=\"trust update refused\" device=%s reason=\"%s\"", d->id, why);
		return;
	}
	trust_counts[0] += c.applied;
	trust_counts[1] += c.held;
	history_trust(d);
	history_fleet_epoch();
	logf_("INFO", "msg=\"trust update\" device=%s applied=%u held=%u certificates=%d revocations=%llu epoch=%llu", d->id,
		c.applied, c.held, trust.ncerts, (unsigned long long)trust.rev_version, (unsigned long long)trust.epoch);
}

/* fw_after is a firmware device's part after the ack: its stale refusals
 * in the log (as devsim's), the retained state report, and the reboot a
 * step asked for (exit 3 once the ack and the report are out). */
static void fw_after(struct mosquitto *m, device *d, const efs_result *r)
{
	uint8_t st[EFSDEV_MAX_SIGNED_ACK];
	size_t sn;

	if (r->verdict == EFS_STALE) {
		logf_("WARN", "msg=\"stale command refused\" device=%s kind=%.*s token=%llu seq=%llu holder=%.*s id=%.*s ", d->id,
			(int)r->env.kind.n, (const char *)r->env.kind.p, (unsigned long long)r->env.token,
			(unsigned long long)r->env.seq, (int)r->env.holder.n, (const char *)r->env.holder.p, (int)r->env.id.n,
			(const char *)r->env.id.p);
	}
	if ((sn = state_report(d, d->mark, st, sizeof st)) > 0) {
		publish(m, d->state, st, sn, NULL, 1);
	}
	if (efs_fw_reboot_pending(&d->fw->fw)) {
		reboot_requested = 1;
		logf_("INFO", "msg=\"reboot requested\" device=%s fw_state=%s", d->id,
			efs_fw_state_name((efs_fw_state)d->fw->fw.job.state));
	}
}

static void on_publish(struct mosquitto *m, void *obj, int mid)
{
	(void)m;
	(void)obj;
	(void)mid;
	inflight--;
}

static void handle(struct mosquitto *m, device *d, const struct mosquitto_message *msg, const mosquitto_property *props)
{
	efs_result r;
	efs_ack ack;
	uint8_t out[EFSDEV_MAX_SIGNED_ACK], st[EFSDEV_MAX_SIGNED_ACK];
	size_t len, sn;
	char *rt = NULL;
	const char *topic = d->ack;
	efsdev_changes c;
	const char *reason;
	efsdev_journal_rec *j = &d->journal.rec;
	int accepting;

	if (reboot_requested) {
		logf_("WARN", "msg=\"command while rebooting: dropped (the agent resends it)\" device=%s", d->id);
		return;
	}
	last_verify.valid = 0;
	if (trusted && msg->payloadlen > 0 && ((const uint8_t *)msg->payload)[0] >= 0x81 &&
	    ((const uint8_t *)msg->payload)[0] <= 0x88) {
		take_update(d, msg->payload, (size_t)msg->payloadlen);
		return; /* a trust update is not a command: no ack */
	}
	if (take(d, msg->payload, (size_t)msg->payloadlen, &accepting) != 0) {
		return;
	}
	if (d->fw != NULL) { /* a reset, or a step or the thermostat's command */
		d->fw->accepted = 0;
		efs_fw_handle(&d->fw->fw, (const uint8_t *)d->id, strlen(d->id), msg->payload, (size_t)msg->payloadlen, &r);
		accepting = accepting || d->fw->accepted; /* its accept is in the history already */
	} else {
		efs_handle(&d->ctx, (const uint8_t *)d->id, strlen(d->id), msg->payload, (size_t)msg->payloadlen, &r);
	}
	last_verify.valid = 0;
	if (r.verdict == EFS_ACCEPTED) {
		d->mark = r.mark;
	}
	if (r.apply) {
		kill_after_mark();
	}
	if (r.apply && (d->fw == NULL || d->fw->fw.other) && efsdev_parse(&r.env, &c, &reason) == 0) {
		efsdev_apply(&j->state, &c, r.env.token, r.env.seq, r.env.id);
		j->pending = 0;
		if (efsdev_journal_write(&d->journal) != 0) { /* the pending command is on disk: a restart applies it */
			logf_("ERROR", "msg=\"state journal not written\" device=%s err=\"%s\"", d->id, strerror(errno));
		}
	}
	counts[r.verdict <= 4 ? r.verdict : 0]++;
	if (r.reset) { /* as devices/shim: logged, and once applied the move to its epoch in the history */
		if (r.verdict == EFS_ACCEPTED) {
			history_event(d, "epoch", &r.env.id, r.epoch, r.mark.token, r.mark.seq, NULL, NULL, "fence reset", NULL);
		}
		logf_("WARN", "msg=\"%s\" device=%s mark=%llu/%llu epoch=%llu counter=%llu reason=\"%s\"",
			r.verdict == EFS_ACCEPTED ? "fence reset by the operator" : "reset refused", d->id,
			(unsigned long long)r.mark.token, (unsigned long long)r.mark.seq, (unsigned long long)r.epoch,
			(unsigned long long)d->ctx.reset_counter, r.reason);
	} else {
		record_decision(d, &r, accepting);
	}
	log_verdict(d, &r);
	efs_result_ack(&r, &ack);
	if (efs_encode_ack(&ack, out, sizeof out, &len) != EFS_OK || (len = sign(d, content_ack, out, len)) == 0) {
		logf_("ERROR", "msg=\"ack does not encode\" device=%s", d->id);
		return;
	}
	if (props != NULL && mosquitto_property_read_string(props, MQTT_PROP_RESPONSE_TOPIC, &rt, false) != NULL) {
		if (response_topic_ok(d, rt)) {
			topic = rt;
		} else {
			logf_("WARN", "msg=\"response topic refused; acking on the ack topic\" device=%s", d->id);
		}
	}
	publish(m, topic, out, len, props, 0);
	free(rt);
	if (d->fw != NULL) { /* devsim --firmware: a retained report after every command */
		fw_after(m, d, &r);
	} else if (r.apply && (sn = state_report(d, r.mark, st, sizeof st)) > 0) {
		publish(m, d->state, st, sn, NULL, 0);
	}
}

static void on_message(struct mosquitto *m, void *obj, const struct mosquitto_message *msg, const mosquitto_property *props)
{
	int i;

	(void)obj;
	for (i = 0; i < ndev; i++) {
		if (strcmp(msg->topic, devs[i].cmd) == 0) {
			handle(m, &devs[i], msg, props);
			return;
		}
	}
	logf_("WARN", "msg=\"message on an unknown topic\" topic=%s", msg->topic);
}

/* SUB_TRIES bounds the SUBSCRIBEs of one topic on one connection: a
 * broker that still has an earlier session's packet in flight under the
 * new one's packet identifier refuses it (0x91, Packet Identifier in use)
 * and a later identifier goes through. */
#define SUB_TRIES 64
#define SUBACK_PACKET_ID_IN_USE 0x91

static void subscribe_cmd(struct mosquitto *m, device *d)
{
	int s;

	d->sub_tries++;
	s = mosquitto_subscribe_v5(m, &d->sub_mid, d->cmd, 1, 0, NULL);
	if (s != MOSQ_ERR_SUCCESS) {
		logf_("ERROR", "msg=\"subscribe\" topic=%s err=\"%s\"", d->cmd, mosquitto_strerror(s));
	}
}

static void on_connect(struct mosquitto *m, void *obj, int rc, int flags, const mosquitto_property *props)
{
	int i;

	(void)obj;
	(void)flags;
	(void)props;
	if (rc != 0) {
		logf_("ERROR", "msg=\"connect refused\" reason=\"%s\"", mosquitto_reason_string(rc));
		return;
	}
	logf_("INFO", "msg=connected session_present=%d", flags);
	granted = 0;
	for (i = 0; i < ndev; i++) {
		devs[i].sub_tries = 0;
		subscribe_cmd(m, &devs[i]);
	}
}

static void on_subscribe(struct mosquitto *m, void *obj, int mid, int n, const int *qos, const mosquitto_property *props)
{
	device *d = NULL;

	(void)obj;
	(void)props;
	for (int i = 0; i < ndev; i++) {
		if (devs[i].sub_mid == mid) {
			d = &devs[i];
		}
	}
	if (n < 1 || qos[0] >= 0x80) {
		int code = n < 1 ? -1 : qos[0];
		int again = d != NULL && code == SUBACK_PACKET_ID_IN_USE && d->sub_tries < SUB_TRIES;

		logf_("ERROR", "msg=\"subscription refused\" topic=%s code=%d again=%d", d != NULL ? d->cmd : "?", code, again);
		if (again) {
			subscribe_cmd(m, d);
		}
		return;
	}
	if (++granted == ndev && !ready_logged) {
		uint8_t st[EFSDEV_MAX_SIGNED_ACK];

		for (int i = 0; fw_mode && i < ndev; i++) { /* the boot's outcome, retained */
			size_t sn;
			if ((sn = state_report(&devs[i], devs[i].mark, st, sizeof st)) > 0) {
				publish(m, devs[i].state, st, sn, NULL, 1);
			}
		}
		ready_logged = 1;
		logf_("INFO", "msg=ready devices=%d prefix=%s", ndev, prefix);
	}
}

/* recover finishes a command whose mark reached flash before a kill
 * stopped its effect reaching the state journal. */
static int recover(device *d)
{
	efs_mark_record mr;
	efsdev_journal_rec *j = &d->journal.rec;

	if (efs_read_mark_record(&d->ctx, &mr) != EFS_OK) {
		return 0; /* corrupt: the context refuses everything */
	}
	d->mark = mr.mark;
	if (!j->pending) {
		return 0;
	}
	if (mr.mark.token == j->p_token && mr.mark.seq == j->p_seq && mr.id_len == j->p_id_len &&
	    memcmp(mr.id, j->p_id, mr.id_len) == 0 && !(j->state.last_token == j->p_token && j->state.last_seq == j->p_seq)) {
		efs_bytes id;
		id.p = (const uint8_t *)j->p_id;
		id.n = j->p_id_len;
		efsdev_apply(&j->state, &j->p_changes, j->p_token, j->p_seq, id);
		logf_("INFO", "msg=\"applied the command whose mark was on flash before the restart\" device=%s token=%llu seq=%llu",
			d->id, (unsigned long long)j->p_token, (unsigned long long)j->p_seq);
	}
	j->pending = 0;
	return efsdev_journal_write(&d->journal);
}

/* valid_id is fence.ValidateDeviceID: 1 to 128 of [A-Za-z0-9._-], not
 * starting with '.'. */
static int valid_id(const char *id)
{
	size_t i, n = strlen(id);

	if (n == 0 || n > EFS_MAX_DEVICE_ID_LEN || id[0] == '.') {
		return 0;
	}
	for (i = 0; i < n; i++) {
		char c = id[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
			return 0;
		}
	}
	return 1;
}

/* fw_accepting records a firmware step's accept in the history before
 * its mark is stored, as devices/shim does (take does it for the
 * thermostat's commands). */
static void fw_accepting(void *user, const efs_result *r)
{
	const device *d = user;

	history_event(d, "verdict", &r->env.id, r->env.epoch, r->env.token, r->env.seq, &r->env.kind, "accepted", NULL, &r->env);
}

/* fw_root is the root that signs image manifests, as devsim's: the trust's
 * (--trust-root), else --reset-root's; NULL: manifests are only bounded. */
static efsdev_trust *fw_root(void)
{
	return trusted ? &trust : reset_trust.root_loaded ? &reset_trust : NULL;
}

/* open_firmware opens the device's firmware job and boots it. */
static int open_firmware(device *d, const char *dir)
{
	const char *why = "";

	if ((d->fw = calloc(1, sizeof *d->fw)) != NULL) {
		d->fw->on_accept = fw_accepting;
		d->fw->accept_user = d;
	}
	if (d->fw == NULL ||
	    efsdev_fw_open(d->fw, dir, d->id, &d->ctx, &fw_opts, fw_root(), check, &why) != 0) {
		logf_("ERROR", "msg=\"firmware: open and boot\" device=%s err=\"%s\" errno=\"%s\"", d->id, why, strerror(errno));
		return -1;
	}
	logf_("INFO", "msg=\"firmware booted\" device=%s slot=%s fw_state=%s boots=%llu firmware=\"%s\" manifests=%d", d->id,
		d->fw->fw.boot.running == 0 ? "a" : "b", efs_fw_state_name((efs_fw_state)d->fw->fw.job.state),
		(unsigned long long)d->fw->fw.boot.boots, d->fw->version, fw_root() != NULL);
	return 0;
}

static int open_device(device *d, const char *dir, const char *id, const char *keys)
{
	char path[PATH_MAX];
	efs_err e;

	if (!valid_id(id)) {
		logf_("ERROR", "msg=\"bad device id: want 1 to 128 of [A-Za-z0-9._-], not starting with '.' (fence.ValidateDeviceID)\"");
		return -1;
	}
	strcpy(d->id, id);
	snprintf(d->cmd, sizeof d->cmd, "%s/dev/%s/cmd", prefix, id);
	snprintf(d->ack, sizeof d->ack, "%s/dev/%s/ack", prefix, id);
	snprintf(d->state, sizeof d->state, "%s/dev/%s/state", prefix, id);
	snprintf(path, sizeof path, "%s/%s.flash", dir, id);
	if (efsdev_flash_open(&d->flash, path) != 0) {
		logf_("ERROR", "msg=\"open flash\" path=%s err=\"%s\"", path, strerror(errno));
		return -1;
	}
	efsdev_flash_port(&d->flash, &d->port);
	d->port.check = fw_mode ? NULL : check; /* firmware: the thermostat is port.other */
	if (trusted) {
		d->port.sha256 = sha256;
		d->port.verify = verify;
		d->port.epoch = fleet_epoch;
	}
	if (trusted || reset_trust.root_loaded) {
		d->port.sha256 = sha256;
		d->port.verify_root = verify_root;
	}
	snprintf(path, sizeof path, "%s/%s.state", dir, id);
	if (efsdev_journal_open(&d->journal, path) != 0) {
		logf_("ERROR", "msg=\"open state journal\" path=%s err=\"%s\"", path, strerror(errno));
		return -1;
	}
	if (keys != NULL) {
		char cert[PATH_MAX];
		const char *why;
		snprintf(path, sizeof path, "%s/%s.key", keys, id);
		snprintf(cert, sizeof cert, "%s/%s.cert", keys, id);
		if (efsdev_signer_open(&d->signer, path, cert, id, &trust, &why) != 0) {
			logf_("ERROR", "msg=\"--device-keys\" device=%s key=%s err=\"%s\"", id, path, why);
			return -1;
		}
	}
	if ((e = efs_open(&d->ctx, &d->port)) != EFS_OK) {
		d->corrupt = 1;
		logf_("ERROR", "msg=\"stored mark unreadable: refusing every command\" device=%s err=\"%s\"", id, efs_strerror(e));
	}
	if (fw_mode && open_firmware(d, dir) != 0) {
		return -1;
	}
	if (recover(d) != 0) {
		logf_("ERROR", "msg=\"state journal not written\" device=%s err=\"%s\"", id, strerror(errno));
		return -1;
	}
	history_event(d, "opened", NULL, d->ctx.epoch, d->mark.token, d->mark.seq, NULL, NULL, NULL, NULL);
	logf_("INFO", "msg=\"device open\" device=%s token=%llu seq=%llu applied=%llu epoch=%llu", id,
		(unsigned long long)d->mark.token, (unsigned long long)d->mark.seq, (unsigned long long)d->journal.rec.state.applied,
		(unsigned long long)efs_state_of(&d->ctx).epoch);
	return 0;
}

/* lock_dir takes <dir>/efsdev.lock: one process per directory. */
static int lock_dir(const char *dir)
{
	char path[PATH_MAX];
	struct flock fl;
	int fd;

	snprintf(path, sizeof path, "%s/efsdev.lock", dir);
	if ((fd = open(path, O_RDWR | O_CREAT, 0600)) < 0) {
		return -1;
	}
	memset(&fl, 0, sizeof fl);
	fl.l_type = F_WRLCK;
	fl.l_whence = SEEK_SET;
	if (fcntl(fd, F_SETLK, &fl) != 0) {
		logf_("ERROR", "msg=\"directory locked: another efsdev runs on it\" dir=%s", dir);
		return -1;
	}
	return 0; /* fd stays open: the lock lasts as long as the process */
}

static int usage(const char *msg)
{
	fprintf(stderr, "efsdev: %s\nusage: efsdev --mqtt URL --devices ID[,ID...] --dir DIR [--prefix P] [--log FILE] "
		"[--client-id ID] [--mqtt-user U] [--mqtt-password-file F] [--history FILE [--history-source SRC]] "
		"[--trust-root PUB --trust-root-kid KID [--certs F,F...] [--revocations F] [--epoch F] [--device-keys DIR]] "
		"[--reset-root PUB --trust-root-kid KID] "
		"[--firmware [--fw-window D] [--fw-tries N] [--fw-security N] [--fw-max-image BYTES]]\n", msg);
	return 2;
}

/* fw_options reads the --fw-* flags (--firmware's, and only its). */
static int fw_options(const options *o)
{
	char *end = NULL;
	unsigned long long v;

	fw_mode = o->firmware != NULL;
	fw_opts.window_ms = 30000; /* fwjob.DefaultHealthWindow */
	fw_opts.max_image = 256u << 20; /* fwjob.DefaultMaxImage */
	if (!fw_mode) {
		return o->fw_window != NULL || o->fw_tries != NULL || o->fw_security != NULL || o->fw_max_image != NULL ? -1 : 0;
	}
	if (o->fw_window != NULL && efsdev_fw_duration_ms(o->fw_window, &fw_opts.window_ms) != 0) {
		return -1;
	}
	if (o->fw_tries != NULL) {
		v = strtoull(o->fw_tries, &end, 10);
		if (*end != '\0' || v < 1 || v > 255) {
			return -1;
		}
		fw_opts.tries = (uint8_t)v;
	}
	if (o->fw_security != NULL) {
		fw_opts.security = strtoull(o->fw_security, &end, 10);
		if (*end != '\0') {
			return -1;
		}
	}
	if (o->fw_max_image != NULL) {
		v = strtoull(o->fw_max_image, &end, 10);
		if (*end != '\0' || v < 1 || v > UINT32_MAX) {
			return -1;
		}
		fw_opts.max_image = (uint32_t)v;
	}
	return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
	const struct {
		const char *flag;
		const char **to;
	} flags[] = {
		{"--mqtt", &o->broker}, {"--devices", &o->devices}, {"--dir", &o->dir}, {"--prefix", &o->prefix},
		{"--log", &o->log}, {"--client-id", &o->client_id}, {"--mqtt-user", &o->user},
		{"--mqtt-password-file", &o->pass_file}, {"--history", &o->history}, {"--history-source", &o->history_source},
		{"--trust-root", &o->trust_root}, {"--trust-root-kid", &o->trust_root_kid}, {"--certs", &o->certs},
		{"--revocations", &o->revocations}, {"--epoch", &o->epoch}, {"--device-keys", &o->device_keys},
		{"--reset-root", &o->reset_root},
		{"--fw-window", &o->fw_window}, {"--fw-tries", &o->fw_tries}, {"--fw-security", &o->fw_security},
		{"--fw-max-image", &o->fw_max_image},
	};
	size_t k;
	int i;

	memset(o, 0, sizeof *o);
	for (i = 1; i < argc; i += 2) {
		if (strcmp(argv[i], "--firmware") == 0 || strcmp(argv[i], "--fw-status") == 0) { /* flags without a value */
			*(strcmp(argv[i], "--firmware") == 0 ? &o->firmware : &o->fw_status) = argv[i];
			i--;
			continue;
		}
		if (i + 1 >= argc) {
			return usage("a flag without its value");
		}
		for (k = 0; k < sizeof flags / sizeof flags[0] && strcmp(argv[i], flags[k].flag) != 0; k++) {
		}
		if (k == sizeof flags / sizeof flags[0]) {
			return usage("unknown flag");
		}
		*flags[k].to = argv[i + 1];
	}
	if (o->fw_status != NULL) {
		o->firmware = o->fw_status; /* read the firmware state on flash and exit: no broker */
		return o->devices == NULL || o->dir == NULL || strchr(o->devices, ',') != NULL || fw_options(o) != 0
			? usage("--fw-status reads one device: --dir DIR --devices ID") : 0;
	}
	if (o->broker == NULL || o->devices == NULL || o->dir == NULL) {
		return usage("--mqtt, --devices and --dir are required");
	}
	if (fw_options(o) != 0) {
		return usage("--fw-window (e.g. 30s, 500ms), --fw-tries (1..255), --fw-security, --fw-max-image (1..2^32-1) "
			"go with --firmware");
	}
	if ((o->trust_root == NULL && o->reset_root == NULL) != (o->trust_root_kid == NULL) ||
	    (o->trust_root == NULL && (o->certs != NULL || o->revocations != NULL || o->epoch != NULL || o->device_keys != NULL))) {
		return usage("--trust-root (or --reset-root) and --trust-root-kid go together; --certs, --revocations, --epoch and "
			"--device-keys need them (--trust-root)");
	}
	return 0;
}

/* password returns the MQTT password of --mqtt-user (static storage). */
static const char *password(const options *o)
{
	static char buf[512];
	FILE *f;

	if (o->pass_file == NULL) {
		return getenv("EDGEFENCE_MQTT_PASSWORD");
	}
	if ((f = fopen(o->pass_file, "r")) == NULL || fgets(buf, sizeof buf, f) == NULL) {
		if (f != NULL) {
			fclose(f);
		}
		return NULL;
	}
	fclose(f);
	buf[strcspn(buf, "\r\n")] = '\0';
	return buf;
}

/* open_trust reads the root, the store's file (what earlier runs learned),
 * --certs and --revocations; a file that fails stops the start. */
static int open_trust(const options *o)
{
	char path[PATH_MAX], list[8192], *tok, *save = NULL;
	const char *why;
	struct timespec ts;

	snprintf(path, sizeof path, "%s/trust.cbor", o->dir);
	if (efsdev_trust_init(&trust, o->trust_root, o->trust_root_kid, path) != 0) {
		logf_("ERROR", "msg=\"--trust-root: want a P-256 public key (PKIX PEM) and a kid of 1 to 64 bytes\" path=%s", o->trust_root);
		return -1;
	}
	if (access(path, F_OK) == 0 && efsdev_trust_file(&trust, path, 1, &why) != 0) {
		logf_("ERROR", "msg=\"trust store unreadable\" path=%s err=\"%s\"", path, why);
		return -1;
	}
	snprintf(list, sizeof list, "%s", o->certs != NULL ? o->certs : "");
	for (tok = strtok_r(list, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
		if (efsdev_trust_file(&trust, tok, 0, &why) != 0) {
			logf_("ERROR", "msg=\"--certs\" path=%s err=\"%s\"", tok, why);
			return -1;
		}
	}
	if (o->revocations != NULL && efsdev_trust_file(&trust, o->revocations, 0, &why) != 0) {
		logf_("ERROR", "msg=\"--revocations\" path=%s err=\"%s\"", o->revocations, why);
		return -1;
	}
	if (o->epoch != NULL && efsdev_trust_epoch_file(&trust, o->epoch, &why) != 0) {
		logf_("ERROR", "msg=\"--epoch\" path=%s err=\"%s\"", o->epoch, why);
		return -1;
	}
	trusted = 1;
	clock_gettime(CLOCK_REALTIME, &ts);
	report_counter = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	logf_("INFO", "msg=\"trust: commands must be signed\" root=%s certificates=%d revocations=%llu epoch=%llu",
		o->trust_root_kid, trust.ncerts, (unsigned long long)trust.rev_version, (unsigned long long)trust.epoch);
	return 0;
}

static int open_all(options *o)
{
	char list[4096], *tok, *save = NULL;

	if (o->prefix != NULL) {
		if (o->prefix[0] == '\0' || strlen(o->prefix) > 256 || strpbrk(o->prefix, "+#") != NULL) {
			return usage("--prefix: 1 to 256 bytes, no wildcard");
		}
		prefix = o->prefix;
	}
	if (mkdir(o->dir, 0700) != 0 && errno != EEXIST) {
		logf_("ERROR", "msg=\"create --dir\" dir=%s err=\"%s\"", o->dir, strerror(errno));
		return 1;
	}
	if (lock_dir(o->dir) != 0) {
		return 1;
	}
	if (o->log != NULL && (vlog_fd = open(o->log, O_WRONLY | O_CREAT | O_APPEND, 0644)) < 0) {
		logf_("ERROR", "msg=\"open verdict log\" err=\"%s\"", strerror(errno));
		return 1;
	}
	if (o->history_source != NULL) {
		if (o->history_source[0] == '\0' || strlen(o->history_source) > 64) {
			return usage("--history-source: 1 to 64 bytes");
		}
		hist_source = o->history_source;
	}
	if (o->history != NULL && (hist_fd = open(o->history, O_WRONLY | O_CREAT | O_APPEND, 0644)) < 0) {
		logf_("ERROR", "msg=\"open history\" err=\"%s\"", strerror(errno));
		return 1;
	}
	if (o->trust_root != NULL && open_trust(o) != 0) {
		return 1;
	}
	history_fleet_epoch(); /* one provisioned or kept is in effect from the start */
	if (o->reset_root != NULL) {
		if (efsdev_trust_init(&reset_trust, o->reset_root, o->trust_root_kid, "") != 0) {
			logf_("ERROR", "msg=\"--reset-root: want a P-256 public key (PKIX PEM) and a kid of 1 to 64 bytes\" path=%s", o->reset_root);
			return 1;
		}
		logf_("INFO", "msg=\"resets: the operator root's\" root=%s", o->trust_root_kid);
	}
	if (strlen(o->devices) >= sizeof list) {
		return usage("--devices: the list is too long");
	}
	snprintf(list, sizeof list, "%s", o->devices);
	if (fw_mode && strchr(list, ',') != NULL) {
		return usage("--firmware takes one device per process (edgefence-devsim --firmware --c-device supervises one each)");
	}
	for (tok = strtok_r(list, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
		if (ndev == MAX_DEVICES) {
			logf_("ERROR", "msg=\"too many devices\" max=%d", MAX_DEVICES);
			return 1;
		}
		if (open_device(&devs[ndev], o->dir, tok, o->device_keys) != 0) {
			return 1;
		}
		ndev++;
	}
	if (ndev == 0) {
		return usage("--devices lists no device");
	}
	if (fw_mode && ndev != 1) {
		return usage("--firmware takes one device per process (edgefence-devsim --firmware --c-device supervises one each)");
	}
	return 0;
}

static struct mosquitto *client(const options *o)
{
	char id[128];
	struct mosquitto *m;

	if (o->client_id != NULL) {
		snprintf(id, sizeof id, "%s", o->client_id);
	} else {
		snprintf(id, sizeof id, "efsdev-%08x", (unsigned)efs_crc32c((const uint8_t *)o->dir, strlen(o->dir)));
	}
	if ((m = mosquitto_new(id, false, NULL)) == NULL) {
		return NULL;
	}
	mosquitto_int_option(m, MOSQ_OPT_PROTOCOL_VERSION, MQTT_PROTOCOL_V5);
	/* the PUBACK and the ack are two small writes: without TCP_NODELAY
	 * Nagle holds the second until the broker's delayed ACK (40 ms) */
	mosquitto_int_option(m, MOSQ_OPT_TCP_NODELAY, 1);
	if (o->user != NULL) {
		const char *pass = password(o);
		if (pass == NULL || pass[0] == '\0') {
			logf_("ERROR", "msg=\"--mqtt-user without a password ($EDGEFENCE_MQTT_PASSWORD or --mqtt-password-file)\"");
			mosquitto_destroy(m);
			return NULL;
		}
		mosquitto_username_pw_set(m, o->user, pass);
	}
	mosquitto_connect_v5_callback_set(m, on_connect);
	mosquitto_subscribe_v5_callback_set(m, on_subscribe);
	mosquitto_message_v5_callback_set(m, on_message);
	mosquitto_publish_callback_set(m, on_publish);
	return m;
}

static void pause_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* serve connects and runs the client until SIGINT or SIGTERM. */
static void serve(struct mosquitto *m, const char *broker)
{
	char host[256];
	const char *hp = broker, *colon;
	int port = 1883, connected = 0, rc;
	mosquitto_property *props = NULL;

	if (strncmp(hp, "mqtt://", 7) == 0 || strncmp(hp, "tcp://", 6) == 0) {
		hp = strstr(hp, "://") + 3;
	}
	snprintf(host, sizeof host, "%s", hp);
	if ((colon = strrchr(hp, ':')) != NULL) {
		host[colon - hp] = '\0';
		port = atoi(colon + 1);
	}
	mosquitto_property_add_int32(&props, MQTT_PROP_SESSION_EXPIRY_INTERVAL, SESSION_EXPIRY);
	while (!stopping && !(reboot_requested && inflight <= 0)) {
		if (!connected) {
			rc = mosquitto_connect_bind_v5(m, host, port, 30, NULL, props);
			connected = rc == MOSQ_ERR_SUCCESS;
			if (!connected) {
				logf_("WARN", "msg=\"connect\" broker=%s err=\"%s\"", broker, mosquitto_strerror(rc));
				pause_ms(200);
			}
			continue;
		}
		if ((rc = mosquitto_loop(m, 100, 1)) != MOSQ_ERR_SUCCESS && !stopping) {
			logf_("WARN", "msg=\"connection lost; reconnecting\" err=\"%s\"", mosquitto_strerror(rc));
			pause_ms(200);
			connected = mosquitto_reconnect(m) == MOSQ_ERR_SUCCESS;
		}
	}
	mosquitto_property_free_all(&props);
	if (connected) {
		mosquitto_disconnect_v5(m, 0, NULL);
		mosquitto_loop(m, 100, 1);
	}
}

/* fw_status is --fw-status: the firmware state of a stopped device. */
static int fw_status(const options *o)
{
	char path[PATH_MAX];
	device *d = &devs[0];
	efsdev_fw_dev *f = calloc(1, sizeof *f);
	int rc = 1;

	snprintf(path, sizeof path, "%s/%s.flash", o->dir, o->devices);
	if (f != NULL && valid_id(o->devices) && efsdev_flash_open(&d->flash, path) == 0) {
		efsdev_flash_port(&d->flash, &d->port);
		(void)efs_open(&d->ctx, &d->port);
		rc = efsdev_fw_status(f, o->dir, o->devices, &d->ctx, &fw_opts);
	} else {
		fprintf(stderr, "efsdev: --fw-status: %s: cannot open\n", path);
	}
	free(f);
	return rc;
}

int main(int argc, char **argv)
{
	options o;
	struct mosquitto *m;
	struct sigaction sa;
	int rc, i;

	if ((rc = parse_args(argc, argv, &o)) != 0) {
		return rc;
	}
	if (o.fw_status != NULL) {
		return fw_status(&o);
	}
	if ((rc = open_all(&o)) != 0) {
		return rc;
	}
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	mosquitto_lib_init();
	if ((m = client(&o)) == NULL) {
		return 1;
	}
	logf_("INFO", "msg=\"device fleet starting\" devices=%d broker=%s", ndev, o.broker);
	serve(m, o.broker);
	logf_("INFO", "msg=stopped reboot=%d accepted=%lu duplicate=%lu stale=%lu invalid=%lu trust_applied=%lu trust_held=%lu "
		"trust_refused=%lu", reboot_requested, counts[EFS_ACCEPTED], counts[EFS_DUPLICATE], counts[EFS_STALE], counts[EFS_INVALID],
		trust_counts[0], trust_counts[1], trust_counts[2]);
	for (i = 0; i < ndev; i++) {
		efsdev_signer_free(&devs[i].signer);
		free(devs[i].fw);
	}
	efsdev_trust_free(&trust);
	mosquitto_destroy(m);
	mosquitto_lib_cleanup();
	return reboot_requested ? 3 : 0; /* 3: a reboot (edgefence-devsim's exitReboot): the supervisor restarts it */
}
