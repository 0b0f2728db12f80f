/*
 * efsdev.h: the pieces of efsdev, the C thermostat device on libmosquitto
 * (efsdev.c): its flash file (flash_file.c) and its thermostat model with
 * the state journal (thermostat.c).
 */
#ifndef EFSDEV_H
#define EFSDEV_H

#include <stddef.h>
#include <stdint.h>

#include "efshim.h"

/* The device's two "flash sectors": one file, <dir>/<id>.flash, of
 * 2 * EFSDEV_SECTOR bytes; erase fills a sector with 0xFF, program
 * pwrites; both fdatasync before they return. */
#define EFSDEV_SECTOR 4096u

typedef struct {
	int fd;
} efsdev_flash;

int efsdev_flash_open(efsdev_flash *f, const char *path);
void efsdev_flash_port(efsdev_flash *f, efs_port *port);

/* A thermostat's state: sim.State's fields. */
#define EFSDEV_MODE_OFF 0
typedef struct {
	double setpoint;
	uint8_t mode; /* index in efsdev_modes */
	uint8_t relay;
	uint64_t applied;
	uint64_t last_token, last_seq;
	uint8_t last_id_len;
	char last_id[EFS_MAX_ID_LEN];
} efsdev_state;

extern const char *const efsdev_modes[4];

/* A command's changes (sim.SetBody): what set and twin.set change. */
typedef struct {
	uint8_t has_setpoint, has_mode, has_relay;
	double setpoint;
	uint8_t mode, relay;
} efsdev_changes;

/* efsdev_parse checks a command's kind and body as sim.Thermostat's Check
 * does (set, twin.set, ping) and returns its changes; 0 if it goes, else
 * -1 with *reason set. */
int efsdev_parse(const efs_envelope *env, efsdev_changes *c, const char **reason);
void efsdev_apply(efsdev_state *s, const efsdev_changes *c, uint64_t token, uint64_t seq, efs_bytes id);

/* The state journal, <dir>/<id>.state: two slots, each a whole record
 * (state and, while a command is being taken, the command: pending) with a
 * generation and a CRC-32C, written alternately with pwrite + fdatasync. */
typedef struct {
	efsdev_state state;
	uint8_t pending; /* a command whose mark may be on flash, its effect not yet in state */
	uint64_t p_token, p_seq;
	uint8_t p_id_len;
	char p_id[EFS_MAX_ID_LEN];
	efsdev_changes p_changes;
} efsdev_journal_rec;

typedef struct {
	int fd;
	uint32_t gen;
	efsdev_journal_rec rec;
} efsdev_journal;

/* efsdev_journal_open reads the newest valid slot (a fresh state if the
 * file is new); -1 if the file holds records but none is valid. */
int efsdev_journal_open(efsdev_journal *j, const char *path);
int efsdev_journal_write(efsdev_journal *j);

/* efsdev_state_cbor encodes s as sim.MarshalState's map (the state topic). */
size_t efsdev_state_cbor(const efsdev_state *s, uint8_t *out, size_t cap);
/* efsdev_json_string appends s as a JSON string to out at *at. */
void efsdev_json_string(char *out, size_t cap, size_t *at, const char *s, size_t n);

/* Trust (trust.c, on mbedTLS): the key store behind port.verify and the
 * fleet epoch behind port.epoch, fed by the operator's root, certificate,
 * list and epoch files and trust updates on the cmd topic; and the device
 * key signing acks and state reports. */
#define EFSDEV_MAX_CERTS 64
#define EFSDEV_MAX_UPDATE 8                        /* auth.MaxUpdateStatements */
#define EFSDEV_MAX_STATEMENT (64u * 1024u)         /* auth.MaxTrustSize */
#define EFSDEV_MAX_UPDATE_SIZE (72u * 1024u)       /* auth.MaxUpdateSize */
#define EFSDEV_MAX_SIGNED_ACK (EFS_MAX_ACK_SIZE + 256u)

#include <mbedtls/ecp.h>

typedef struct {
	uint8_t kid[EFS_MAX_KEY_ID];
	size_t kid_len;
	uint8_t q[65];             /* 0x04 || X || Y */
	mbedtls_ecp_keypair pub;   /* q, loaded (owned) */
	int64_t not_before, not_after, role;
	uint64_t serial, ndevices;
	size_t devices_off;        /* the devices array, in payload */
	uint8_t *raw;              /* the statement as received (owned) */
	size_t raw_n;
	const uint8_t *payload;    /* in raw */
	size_t payload_n;
} efsdev_cert;

typedef struct {
	char root_kid[EFS_MAX_KEY_ID + 1];
	uint8_t root[65];
	mbedtls_ecp_keypair root_key;
	int root_loaded;
	char path[4096];           /* the store's file ("" : not kept) */
	efsdev_cert certs[EFSDEV_MAX_CERTS];
	int ncerts;
	uint8_t *rev_raw;          /* the revocation list held (owned), or NULL */
	size_t rev_n;
	uint64_t rev_version;
	const uint8_t *rev_payload;
	size_t rev_payload_n, rev_kids_off;
	uint8_t *epoch_raw;        /* the epoch statement held (owned), or NULL */
	size_t epoch_n;
	uint64_t epoch;            /* its epoch: the fleet's (port.epoch); 0: none */
} efsdev_trust;

typedef struct {
	unsigned applied, held;
} efsdev_trust_counts;

/* efsdev_trust_init reads the root's public key (PKIX PEM); store is the
 * file the statements learned are kept in ("": none). */
int efsdev_trust_init(efsdev_trust *t, const char *root_pub, const char *root_kid, const char *store);
/* efsdev_trust_init_point is efsdev_trust_init with the root's point
 * (0x04 || X || Y). */
int efsdev_trust_init_point(efsdev_trust *t, const uint8_t root[65], const char *root_kid, const char *store);
void efsdev_trust_free(efsdev_trust *t);
/* efsdev_trust_file takes the statement in path (sequence 0), or every
 * statement of a store file (sequence 1), as trust updates not persisted. */
int efsdev_trust_file(efsdev_trust *t, const char *path, int sequence, const char **why);
/* efsdev_trust_epoch_file takes the epoch statement in path (edgefence
 * keys epoch), kept if it is newer than the one held: 0, or -1 (*why) if
 * it is not the root's epoch statement. */
int efsdev_trust_epoch_file(efsdev_trust *t, const char *path, const char **why);
/* efsdev_trust_update takes a trust update (auth.ParseUpdate's format):
 * 0 taken (counts in *out), -1 refused whole (*why), -2 the store's file
 * could not be written (the update is in memory: stop the process). */
int efsdev_trust_update(efsdev_trust *t, const uint8_t *raw, size_t n, int persist, efsdev_trust_counts *out,
	const char **why);
/* efsdev_trust_revoked_kids calls each for every key id the revocation
 * list held names, in its order: 0 (also with no list), -1 if the list
 * cannot be read. */
int efsdev_trust_revoked_kids(const efsdev_trust *t, void (*each)(void *user, const uint8_t *kid, size_t n), void *user);
/* The port's crypto: user is the efsdev_trust. */
int efsdev_sha256(void *user, const efs_bytes *parts, size_t n, uint8_t digest[32]);
int efsdev_verify(void *user, const uint8_t *kid, size_t kid_len, const uint8_t *device, size_t device_len,
	const uint8_t digest[32], const uint8_t sig[64]);
/* efsdev_verify_root is port.verify_root with the trust's root (resets). */
int efsdev_verify_root(void *user, const uint8_t *kid, size_t kid_len, const uint8_t digest[32], const uint8_t sig[64]);

typedef struct {
	int ready;
	uint8_t kid[EFS_MAX_KEY_ID];
	size_t kid_len;
	mbedtls_ecp_keypair key;
} efsdev_signer;

/* efsdev_signer_open reads a device's key (PKCS#8 PEM) and its device
 * certificate (role device, this device only, this key, the root's). */
int efsdev_signer_open(efsdev_signer *s, const char *key_path, const char *cert_path, const char *device,
	efsdev_trust *t, const char **why);
void efsdev_signer_free(efsdev_signer *s);
/* efsdev_sign writes payload as a COSE_Sign1 of content type ctype signed
 * by s to out; its length, 0 on failure. */
size_t efsdev_sign(efsdev_signer *s, const char *ctype, const uint8_t *payload, size_t n, uint8_t *out, size_t cap);
/* efsdev_state_report encodes auth.StateReport {device, mark, counter,
 * state, epoch (omitted when 0)} under the device's fence state s as
 * fence/auth does (deterministic CBOR); its length, 0 if cap is short. */
size_t efsdev_state_report(const char *device, efs_state s, uint64_t counter, const uint8_t *state, size_t sn, uint8_t *out,
	size_t cap);

/* Firmware mode (efsdev_fw.c, --firmware): the library's firmware job on
 * files in the device's directory: slot-a, slot-b, <id>.fwrec. */
#include "efshim_fw.h"

typedef struct {
	uint32_t window_ms; /* a trial boot's health window (--fw-window) */
	uint8_t tries;      /* trial boots fw.activate arms (--fw-tries; 0: the default) */
	uint64_t security;  /* the factory image's security version (--fw-security) */
	uint32_t max_image; /* bytes (--fw-max-image) */
} efsdev_fw_opts;

typedef struct {
	char dir[3072]; /* the device's directory (shorter than PATH_MAX: its files' names fit) */
	int slot_fd[2];
	efsdev_flash rec; /* the job record's two sectors */
	int (*rec_read)(void *, unsigned, uint32_t, uint8_t *, size_t);
	int (*rec_erase)(void *, unsigned);
	int (*rec_program)(void *, unsigned, uint32_t, const uint8_t *, size_t);
	efs_fw_port port;
	efs_fw fw;
	char version[65]; /* the running image's EDGEFENCE-VERSION */
	/* on_accept (set before efsdev_fw_open, with accept_user) is called
	 * for an accepted step before its mark is stored; accepted says one
	 * was (the caller clears it). */
	void (*on_accept)(void *user, const efs_result *r);
	void *accept_user;
	int accepted;
} efsdev_fw_dev;

/* efsdev_fw_open opens the job on fence (open), boots (the boot loader's
 * decision, a trial's health from its markers) and returns 0, or -1 with
 * *why. trust, if not NULL, holds the root that signs manifests (its kid
 * is port.root_kid; the signatures go to fence's port.verify_root, which
 * must check that root); other is
 * the thermostat's check (Config.Other). */
int efsdev_fw_open(efsdev_fw_dev *f, const char *dir, const char *id, efs_ctx *fence, const efsdev_fw_opts *o,
	efsdev_trust *trust, int (*other)(void *, const struct efs_envelope *, const char **), const char **why);
/* efsdev_fw_report encodes sim.FirmwareState: the thermostat's state, "fw"
 * (fwjob.Status.Report) and "firmware" (the version marker, if any). */
size_t efsdev_fw_report(const efsdev_fw_dev *f, const efsdev_state *s, uint8_t *out, size_t cap);
int efsdev_fw_duration_ms(const char *s, uint32_t *ms);
/* efsdev_fw_status prints the firmware state on flash (fwjob.Status's
 * fields, images in hex) as one JSON line without booting: for a checker
 * reading a stopped device (efsdev --fw-status). 0, or 1 if unreadable. */
int efsdev_fw_status(efsdev_fw_dev *f, const char *dir, const char *id, efs_ctx *fence, const efsdev_fw_opts *o);
/* efsdev_fw_note is fwjob.NoteHistory: a firmware step's job and, for
 * fw.begin, its image in hex ("" when absent), for its history event. */
void efsdev_fw_note(const efs_envelope *env, char job[EFS_FW_MAX_JOB + 1], char image[65]);

#endif
