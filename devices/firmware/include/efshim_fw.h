/*
 * efshim_fw.h: the device's side of a firmware job (devices/fwjob) in C99,
 * behind the fence point of efshim.h.
 *
 * Every step is a fenced command (envelope kind), its body a CBOR map with
 * text keys, as devices/fwjob's BeginBody, ChunkBody and JobBody:
 *
 *	fw.begin    {job, image (SHA-256, 32 bytes), size, version, chunk,
 *	             manifest (the operator's, required with port.root_kid)}
 *	fw.chunk    {job, off, data}   off must be the bytes received
 *	fw.install  {job}              verify the slot -> installed
 *	fw.activate {job}              arm a trial boot of the new slot -> rebooting
 *	fw.commit   {job}              only in confirming
 *	fw.cancel   {job}              abort; rebooting/confirming roll back
 *
 * States, refusals and their reasons are fwjob's (same words: "fwjob:
 * illegal step: fw.install of job j1 in state downloading", "... expected
 * offset N, got M", anti-rollback, another job in progress). The boot
 * loader's part is efs_fw_boot (pick the slot, verify a trial, spend a
 * try) and efs_fw_health (the caller's verdict on a trial boot).
 *
 * Storage: two image slots (A = 0, B = 1) and two record sectors, behind
 * efs_fw_port. The job record is one of two alternating flash slots
 * (commit byte, generation, CRC-32C, like the marks), tagged with the
 * (token, seq) of the step that wrote it, that mark's epoch, and that
 * step's holder and id.
 *
 * Order of a step (durable before effect, safe against a cut at any byte):
 * the slot bytes (fw.begin erases the inactive slot; fw.chunk programs its
 * data), then the job record, then the mark (efs_ctx). In Go the record
 * and the mark commit in one bbolt transaction; here efs_fw_open
 * reconciles: a record whose tag is above the mark (by epoch, then token
 * and seq), under the same reset counter, is a step whose mark write was
 * cut, and the mark is rolled forward to it in its epoch (the step happened:
 * a redelivery is then a Duplicate, never applied twice). A record cut
 * before its commit byte leaves the previous one, and the mark with it: the
 * step did not happen, and its resend programs the same bytes again (NOR:
 * programming a bit already at 0 to 0 changes nothing; a flash with ECC
 * that forbids a second program needs a port that skips bytes already
 * equal). A cut erase of a begin is redone by the resend.
 *
 * Resources: no heap, no globals; efs_fw is the caller's (496 bytes on
 * Cortex-M). Stack, measured on Cortex-M3/M4 (-Os, the port's frames
 * included): 1,740 bytes for efs_fw_process (the record's encoding and a
 * copy of the job on top of efs_process's frames), 1,876 for efs_fw_open,
 * 1,652 for efs_fw_boot; 2,392 for efs_fw_handle with a reset's or a
 * manifest's ES256 verify on mbedTLS. Reentrancy: as efshim.h, one efs_fw per device,
 * calls serialised by the caller.
 */
#ifndef EFSHIM_FW_H
#define EFSHIM_FW_H

#include "efshim.h"

#define EFS_FW_MAX_JOB 64u        /* fwjob.MaxJobLen */
#define EFS_FW_MAX_REASON 200u    /* a job's reason, bytes (fwjob.MaxReasonLen) */
#define EFS_FW_MAX_CHUNK (EFS_MAX_BODY_SIZE - 2048u) /* fwjob.MaxChunk */
#define EFS_FW_MAX_MANIFEST 1024u /* auth.MaxManifestSize */
#define EFS_FW_MAX_NAME 64u       /* auth.MaxManifestName */
#define EFS_FW_DEFAULT_TRIES 3u   /* fwjob.DefaultBootTries */
#define EFS_FW_NO_SLOT 0xffu

/* Job states, in fwjob's order (fwjob.States). */
typedef enum {
	EFS_FW_IDLE = 0,
	EFS_FW_DOWNLOADING,
	EFS_FW_DOWNLOADED,
	EFS_FW_INSTALLING,
	EFS_FW_INSTALLED,
	EFS_FW_REBOOTING,
	EFS_FW_CONFIRMING,
	EFS_FW_COMMITTED,
	EFS_FW_FAILED,
	EFS_FW_ROLLED_BACK
} efs_fw_state;

/* The class of a refused step: fwjob's sentinel errors. */
typedef enum {
	EFS_FW_OK = 0,
	EFS_FW_E_COMMAND,  /* fwjob.ErrCommand: body, kind or bounds */
	EFS_FW_E_STATE,    /* fwjob.ErrState: illegal in the job's state */
	EFS_FW_E_BUSY,     /* fwjob.ErrBusy: another job in progress */
	EFS_FW_E_ROLLBACK, /* fwjob.ErrRollback: image version below the running one */
	EFS_FW_E_MANIFEST, /* fwjob.ErrManifest: the manifest is missing, not the root's, or of another image */
	EFS_FW_E_OFFSET,   /* fwjob.ErrOffset: a chunk not at the bytes received */
	EFS_FW_E_STORAGE   /* fwjob.ErrStorage: slot or record flash failed, or the record is damaged */
} efs_fw_err;

const char *efs_fw_state_name(efs_fw_state s);

/* What a device gives the firmware job: two image slots and two record
 * sectors (NOR: erase to 0xFF, program clears bits), 0 on success. */
typedef struct efs_fw_port {
	void *user;
	uint32_t slot_size;         /* bytes per image slot: the largest image */
	uint32_t record_sector_size; /* bytes per record sector, at least EFS_FW_RECORD_SLOT_MAX */
	int (*slot_read)(void *user, unsigned slot, uint32_t off, uint8_t *buf, size_t n);
	int (*slot_erase)(void *user, unsigned slot);
	int (*slot_program)(void *user, unsigned slot, uint32_t off, const uint8_t *buf, size_t n);
	int (*record_read)(void *user, unsigned sector, uint32_t off, uint8_t *buf, size_t n);
	int (*record_erase)(void *user, unsigned sector);
	int (*record_program)(void *user, unsigned sector, uint32_t off, const uint8_t *buf, size_t n);
	/* Optional: the operator's root, for image manifests (fwjob
	 * Config.Manifests). With root_kid set (the root's kid, 1 to 64
	 * bytes) every fw.begin must carry the image's manifest signed by the
	 * root (auth.Root.Manifest), naming the begin's image, size and
	 * version; else it is refused Invalid (EFS_FW_E_MANIFEST) with fwjob's
	 * words. The library decodes the manifest, checks its structure, the
	 * kid against root_kid and its fields, and hashes the Sig_structure;
	 * the signature goes to the one root hook, the fence port's
	 * verify_root (efshim_port.h: the resets' too). NULL: manifests are
	 * only bounded, as fwjob without Config.Manifests. */
	const uint8_t *root_kid;
	size_t root_kid_len;
	/* Optional: the device's application beside its firmware (fwjob
	 * Config.Other). A command whose kind does not start "fw." goes to
	 * other: its check of kind and body, no side effects, before the admit
	 * rule (nonzero refuses it Invalid, *reason the text); accepted, the
	 * mark is on flash when efs_fw_process returns r.apply with fw->other
	 * set, and the caller applies it then (durable before effect, as
	 * efs_process). NULL: such commands are refused as an unknown kind. */
	int (*other)(void *user, const struct efs_envelope *env, const char **reason);
	/* Optional: called for an accepted step once its slot bytes and job
	 * record are on flash, just before its mark is stored (a history can
	 * record the accept before its commit, as devices/shim does). */
	void (*accepting)(void *user, const efs_result *r);
	uint8_t boot_tries;        /* trial boots fw.activate arms; 0: EFS_FW_DEFAULT_TRIES */
	uint64_t factory_security; /* first boot: the security version of slot A's image */
	uint32_t factory_size;     /* first boot: slot A's image size (its SHA-256 is the active image) */
} efs_fw_port;

/* The job (fwjob's jobRecord without the hash state: the last chunk and
 * the install hash the slot back). */
typedef struct {
	uint8_t id[EFS_FW_MAX_JOB];
	uint8_t id_len;
	uint8_t state; /* efs_fw_state */
	uint8_t slot;
	uint8_t image[32];
	uint64_t size, chunk, version, bytes;
	uint64_t token, seq; /* of the last step */
	uint64_t counter;    /* the fence's reset counter when that step's mark was stored */
	uint64_t epoch;      /* and that mark's epoch */
	uint8_t reason_len;
	char reason[EFS_FW_MAX_REASON];
} efs_fw_job;

/* The boot loader's state (fwjob's bootRecord). */
typedef struct {
	uint8_t active, running, trial, tries; /* trial: EFS_FW_NO_SLOT when none armed */
	uint8_t active_image[32], trial_image[32];
	uint64_t active_size, trial_size;
	uint64_t security, boots;
} efs_fw_boot_state;

/* One device's firmware state. Fields are private but for reading. */
typedef struct {
	const efs_fw_port *port;
	efs_ctx *fence;
	efs_fw_job job;
	efs_fw_boot_state boot;
	uint32_t gen;   /* generation of the newest record slot */
	int8_t cur;     /* its sector, -1 none (never booted) */
	uint8_t broken; /* a step's record is ahead of its mark in this session: reopen */
	uint8_t last;   /* efs_fw_err of the last step */
	uint8_t other;  /* the last command was the application's (port.other) */
} efs_fw;

/* The record on flash (efs_fw_record.c): a slot's largest size, with the
 * sector's superseded byte (its last). */
#define EFS_FW_RECORD_MAX (1u + 1u + EFS_MAX_HOLDER_LEN + 1u + EFS_MAX_ID_LEN + 16u + 1u + EFS_FW_MAX_JOB + 2u + 32u + \
	48u + 1u + EFS_FW_MAX_REASON + 4u + 64u + 32u)
#define EFS_FW_RECORD_SLOT_MAX (12u + EFS_FW_RECORD_MAX)

/* efs_fw_open reads the job record and reconciles the fence's mark with
 * it (rolls the mark forward to a step whose mark write was cut). fence
 * must be open (efs_open). EFS_E_CORRUPT: a damaged record and no valid
 * one, or the newest record damaged (the valid one is marked superseded):
 * every step refused; EFS_E_STORAGE: the roll forward failed, or marking
 * the older record superseded (after a cut just before it) did. A device
 * with no record yet (first boot) opens; efs_fw_boot creates it. */
efs_err efs_fw_open(efs_fw *fw, const efs_fw_port *port, efs_ctx *fence);

/* What efs_fw_boot started. */
typedef struct {
	uint8_t slot;  /* the slot to run */
	int trial;     /* 1: a trial boot of a new image: call efs_fw_health */
	uint8_t image[32];
	uint64_t size;
} efs_fw_boot_info;

/* efs_fw_boot is the boot loader's decision (fwjob.Boot's first
 * transaction): the first boot records slot A (port.factory_*) as active;
 * a job left installing is verified now; a trial armed by fw.activate is
 * verified against its image hash (a slot that does not verify is never
 * booted: rolled back), spends one try (durably, before it runs) or, its
 * tries spent, is rolled back. Call it after efs_fw_open, before taking
 * commands. */
efs_err efs_fw_boot(efs_fw *fw, efs_fw_boot_info *info);

/* efs_fw_health records the caller's verdict on a trial boot: healthy,
 * the job is confirming; not (reason, may be NULL), the trial is rolled
 * back (rolled_back) and the device must boot its active slot. */
efs_err efs_fw_health(efs_fw *fw, int healthy, const char *reason);

/* efs_fw_process is efs_process for a firmware device: every command must
 * be a firmware step; the step runs after the admit rule (a deposed
 * holder's step is Stale, never applied), its slot bytes and record are
 * on flash before the mark moves, and apply=1 says it took effect. An
 * accepted fw.install is verified at once (installed or failed). A
 * refused step is Invalid with fwjob's reason; fw->last is its class. */
void efs_fw_process(efs_fw *fw, const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n,
	efs_result *r);

/* efs_fw_handle is efs_handle for a firmware device (devices/shim's
 * Process in front of fwjob): the operator's reset (efs_is_reset) is
 * answered by the fence point (efshim.h: its mark and counter in one flash
 * slot, r.reset set, nothing to apply; the job record is left as it is),
 * anything else is efs_fw_process'd. The record's tag carries the reset
 * counter of its step, so efs_fw_open never rolls the mark forward over a
 * reset. A reset is refused (Invalid, EFS_E_STORAGE) while the record is
 * ahead of the mark in this session or damaged. */
void efs_fw_handle(efs_fw *fw, const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n,
	efs_result *r);

/* efs_fw_reboot_pending: the boot loader would now boot another slot than
 * the running one (fw.activate armed a trial, or fw.cancel disarmed the
 * running one): the caller restarts through efs_fw_boot. */
int efs_fw_reboot_pending(const efs_fw *fw);

/* efs_sha256 is the library's SHA-256 (the slots are hashed through
 * slot_read, so the port's one-shot hash cannot be used). */
typedef struct {
	uint32_t h[8];
	uint64_t len;
	uint8_t buf[64];
} efs_sha256_ctx;
void efs_sha256_init(efs_sha256_ctx *s);
void efs_sha256_update(efs_sha256_ctx *s, const uint8_t *p, size_t n);
void efs_sha256_final(efs_sha256_ctx *s, uint8_t out[32]);

#endif
