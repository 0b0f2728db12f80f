/* Internal to the efshim library. */
#ifndef EFS_INTERNAL_H
#define EFS_INTERNAL_H

#include "efshim.h"

/* EFS_NOINLINE keeps a helper's locals out of the walk's frame;
 * EFS_INLINE puts a helper's in its caller's (one frame on the peak
 * path rather than two). */
#if defined(__GNUC__)
#define EFS_NOINLINE __attribute__((noinline))
#define EFS_INLINE __inline__ __attribute__((always_inline))
#else
#define EFS_NOINLINE
#define EFS_INLINE
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

/* efs_store writes the mark m accepted in epoch as the newest flash slot
 * (efs_mark.c), with the context's last reset (counter and epoch);
 * efs_store_reset with a new one, rs's (an operator's reset: all in one
 * slot). Pointers: the fence point's peak stack is this call's. */
efs_err efs_store_reset(efs_ctx *c, const efs_mark *m, uint64_t epoch, const efs_bytes *holder, const efs_bytes *id,
	const efs_reset *rs);
#define efs_store(c, m, epoch, holder, id) efs_store_reset((c), (m), (epoch), (holder), (id), NULL)

/* efs_at is fence.State.At: the state s at a fence point whose own epoch
 * for the device is e (a mark of an earlier epoch counts as none). */
static inline efs_state efs_at(efs_state s, uint64_t e)
{
	if (e > s.epoch) {
		s.epoch = e;
		s.mark.token = s.mark.seq = 0;
	}
	return s;
}

/* efs_state_now sets r's state (mark and epoch) to the device's, efs_state_of
 * (efs_process.c). */
void efs_state_now(const efs_ctx *c, efs_result *r);

/* efs_own_epoch is the fence point's own epoch for the device: the
 * highest of the port's fleet epoch (with port.verify) and its last
 * reset's (efs_process.c). */
uint64_t efs_own_epoch(const efs_ctx *c);


/* efs_supersede marks the slot in sector s superseded, through a port's
 * read and program: the byte at at programmed to 0 unless a bit of it is
 * cleared already (a byte is never programmed twice between erases), read
 * back; 0 if it is set (efs_mark.c; the job record's sectors use it too). */
typedef int (*efs_read_fn)(void *user, unsigned sector, uint32_t off, uint8_t *buf, size_t n);
typedef int (*efs_program_fn)(void *user, unsigned sector, uint32_t off, const uint8_t *buf, size_t n);
int efs_supersede(efs_read_fn rd, efs_program_fn pg, void *user, unsigned s, uint32_t at);

/* efs_reset_process is devices/shim's reset (efs_reset.c): verified, the
 * counter above the last one's and the epoch above the device's, then the
 * reset's mark, counter and epoch in one flash slot. blocked, if not EFS_OK, refuses a verified reset with it
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
