/*
 * efshim_port.h: what a device gives the edgefence firmware shim.
 *
 * Storage: two flash sectors (0 and 1) of sector_size bytes each, NOR-style:
 * erase sets every byte to 0xFF, program only clears bits (it is never asked
 * to program a byte twice between erases), read returns what is there. Each
 * call returns 0 on success and anything else on failure; the shim then
 * treats the write as torn (it never applies a command whose mark it could
 * not write and read back).
 *
 * Check: the device's own check of kind and body, before the admit rule.
 *
 * Crypto: verify is reserved for authenticated envelopes (key 15); it is not
 * called by this version, which refuses every envelope that carries an
 * authenticator (as fence.UnmarshalEnvelope does without keys).
 *
 * There is no clock: nothing the shim decides depends on time.
 */
#ifndef EFSHIM_PORT_H
#define EFSHIM_PORT_H

#include <stddef.h>
#include <stdint.h>

struct efs_envelope;

typedef struct efs_port {
	void *user; /* passed to every callback */
	uint32_t sector_size; /* bytes per sector, at least EFS_MARK_SLOT_MAX */
	int (*flash_read)(void *user, unsigned sector, uint32_t off, uint8_t *buf, size_t n);
	int (*flash_erase)(void *user, unsigned sector);
	int (*flash_program)(void *user, unsigned sector, uint32_t off, const uint8_t *buf, size_t n);
	/* The device's check of a command (devices/shim's Device.Check): kind
	 * and body, no side effects. Return 0 to go on, anything else to
	 * refuse it Invalid with the mark unchanged; *reason (may be left
	 * NULL) is a NUL-terminated text for the ack. Called for every command
	 * that decodes and names this device, before the admit rule (also for
	 * ones then found stale or duplicate). May be NULL: every kind goes. */
	int (*check)(void *user, const struct efs_envelope *env, const char **reason);
	/* Reserved (authenticators, next increment): 0 when sig is a valid
	 * signature over msg by key kid. May be NULL. */
	int (*verify)(void *user, const uint8_t *kid, size_t kid_len, const uint8_t *msg, size_t msg_len,
		const uint8_t *sig, size_t sig_len);
} efs_port;

#endif
