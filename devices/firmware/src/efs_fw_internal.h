/* Internal to the firmware job (efs_fw*.c). */
#ifndef EFS_FW_INTERNAL_H
#define EFS_FW_INTERNAL_H

#include "efs_internal.h"
#include "efshim_fw.h"

enum { FW_BEGIN = 1, FW_CHUNK, FW_INSTALL, FW_ACTIVATE, FW_COMMIT, FW_CANCEL };

/* One decoded firmware step (fwjob's step); slices point into the body. */
typedef struct {
	int kind;
	efs_bytes kind_name;
	efs_bytes job;
	efs_bytes image;    /* begin: 32 bytes */
	efs_bytes manifest; /* begin, may be empty */
	efs_bytes data;     /* chunk */
	uint64_t size, version, chunk, off;
} efs_fw_step;

/* A reason being written (fwjob's error text). */
typedef struct {
	char *buf;
	size_t cap;
	size_t at;
} efs_fw_text;

void efs_fw_add(efs_fw_text *t, const char *s);
void efs_fw_add_bytes(efs_fw_text *t, efs_bytes b);
void efs_fw_add_u64(efs_fw_text *t, uint64_t v);
/* efs_fw_short adds fwjob's short(h): the first 8 bytes in hex and "…". */
void efs_fw_add_short(efs_fw_text *t, const uint8_t h[32]);

/* efs_fw_value_head reads a field's head: -1 if it does not decode, 0 for
 * null or undefined (a missing field), 1 for a value. */
int efs_fw_value_head(efs_rd *r, efs_head *h);

/* efs_fw_parse decodes and checks a step on its own (fwjob's parseStep and
 * efs_fw_manifest); on refusal it writes the reason to t. */
efs_fw_err efs_fw_parse(const efs_fw_port *port, const efs_port *root, const efs_envelope *env, efs_fw_step *s,
	efs_fw_text *t);

/* efs_fw_manifest checks a begin's manifest against the operator's root
 * (port.root_kid; the signature through the fence port's verify_root:
 * efs_fw_manifest.c; fwjob's checkManifest); on refusal it writes the
 * reason to t after "check: ". */
efs_fw_err efs_fw_manifest(const efs_fw_port *port, const efs_port *root, const efs_fw_step *s, efs_fw_text *t);

/* efs_fw_is_other: env is the application's (port.other set, the kind
 * not fw.*); efs_fw_other_check asks port.other, nonzero refuses with its
 * reason added to t (efs_fw_other.c). */
int efs_fw_is_other(const efs_fw_port *port, const efs_envelope *env);
int efs_fw_other_check(const efs_fw_port *port, const efs_envelope *env, efs_fw_text *t);

/* efs_fw_load reads the newest valid record into fw (efs_fw_record.c):
 * EFS_OK (fw->cur < 0 if none), or EFS_E_CORRUPT. */
efs_err efs_fw_load(efs_fw *fw, efs_mark_record *tag);
/* efs_fw_save writes job and boot as the newest record, tagged with the
 * job's token and seq and holder and id; on success fw holds them. */
efs_err efs_fw_save(efs_fw *fw, const efs_fw_job *job, const efs_fw_boot_state *boot, efs_bytes holder,
	efs_bytes id);

/* efs_fw_hash_slot hashes the first size bytes of slot; nonzero if it
 * cannot be read. */
int efs_fw_hash_slot(const efs_fw_port *port, unsigned slot, uint64_t size, uint8_t out[32]);

#endif
