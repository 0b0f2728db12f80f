/* Internal to the efshim library. */
#ifndef EFS_INTERNAL_H
#define EFS_INTERNAL_H

#include "efshim.h"

/* EFS_NOINLINE keeps a helper's locals out of the walk's frame. */
#if defined(__GNUC__)
#define EFS_NOINLINE __attribute__((noinline))
#else
#define EFS_NOINLINE
#endif

/* A reader over one buffer. */
typedef struct {
	const uint8_t *b;
	size_t n;
	size_t i;
} efs_rd;

/* One item's head. */
typedef struct {
	unsigned major;
	unsigned ai;
	uint64_t arg;
} efs_head;

efs_err efs_read_head(efs_rd *r, efs_head *h);
/* efs_walk checks one data item at depth (0 at the top) against the
 * decoder's rules, and with keys set also the body's map key rules. It
 * does not recurse. */
efs_err efs_walk(efs_rd *r, unsigned depth, int keys);
/* efs_skip steps over items data items that efs_walk has accepted, without
 * recursion. */
efs_err efs_skip(efs_rd *r, uint64_t items);
int efs_utf8_valid(const uint8_t *p, size_t n);
/* efs_bytes_equal compares two byte strings (no memcmp: memcpy and memset
 * are all the libc the library uses). */
int efs_bytes_equal(const uint8_t *a, size_t an, const uint8_t *b, size_t bn);
int efs_valid_device_id(const uint8_t *p, size_t n);
int efs_valid_name(const uint8_t *p, size_t n, size_t max);

/* efs_bstr_head writes a byte string's head for len in shortest form
 * (at most 9 bytes) and returns its length (efs_cose.c). */
size_t efs_bstr_head(uint8_t *p, size_t len);

/* efs_store writes a mark as the newest flash slot (efs_mark.c), with the
 * context's reset counter; efs_store_reset with a new one (an operator's
 * reset: both in one slot). */
efs_err efs_store_reset(efs_ctx *c, efs_mark m, efs_bytes holder, efs_bytes id, uint64_t counter);
#define efs_store(c, m, holder, id) efs_store_reset((c), (m), (holder), (id), (c)->reset_counter)

/* efs_supersede marks the slot in sector s superseded, through a port's
 * read and program: the byte at at programmed to 0 unless a bit of it is
 * cleared already (a byte is never programmed twice between erases), read
 * back; 0 if it is set (efs_mark.c; the job record's sectors use it too). */
typedef int (*efs_read_fn)(void *user, unsigned sector, uint32_t off, uint8_t *buf, size_t n);
typedef int (*efs_program_fn)(void *user, unsigned sector, uint32_t off, const uint8_t *buf, size_t n);
int efs_supersede(efs_read_fn rd, efs_program_fn pg, void *user, unsigned s, uint32_t at);

/* efs_reset_process is devices/shim's reset (efs_reset.c): verified, the
 * counter above the last one's, then the reset's mark and counter in one
 * flash slot. blocked, if not EFS_OK, refuses a verified reset with it
 * (the mark unchanged): the caller cannot take one now (efs_fw_handle). */
void efs_reset_process(efs_ctx *c, const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n,
	efs_result *r, efs_err blocked);

/* efs_sig_digest hashes a COSE_Sign1's Sig_structure (efs_cose.c). */
efs_err efs_sig_digest(const efs_port *port, const efs_signed *s, uint8_t digest[32]);

/* Reasons: efs_text_add appends s, efs_text_u64 a number in decimal, to
 * buf (cap bytes) at *at, NUL-terminated (efs_process.c). */
void efs_text_add(char *buf, size_t cap, size_t *at, const char *s);
void efs_text_u64(char *buf, size_t cap, size_t *at, uint64_t v);

/* A command's own part (the firmware job): check runs with the port's
 * check, before the admit rule; step runs for an accepted command before
 * its mark is stored. Nonzero refuses it Invalid with the mark unchanged;
 * each writes its reason to r->reason. */
typedef struct {
	int (*check)(void *user, efs_result *r);
	int (*step)(void *user, efs_result *r);
	void *user;
} efs_hook;

void efs_process_hooked(efs_ctx *c, const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n,
	efs_result *r, const efs_hook *h);

#endif
