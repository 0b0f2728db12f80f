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
 * Crypto: SHA-256 and an ES256 verify against the device's keys (the host
 * build uses mbedTLS), for signed commands; absent, commands are plain.
 *
 * Epoch: the fleet epoch the device's trust holds (the newest epoch
 * statement of the operator's root it took in), for signed commands.
 *
 * There is no clock: nothing the shim decides depends on time.
 */
#ifndef EFSHIM_PORT_H
#define EFSHIM_PORT_H

#include <stddef.h>
#include <stdint.h>

struct efs_envelope;
struct efs_bytes;

enum { EFS_PORT_OK = 0, EFS_PORT_UNKNOWN_KEY = 1, EFS_PORT_NOT_AUTHORISED = 2, EFS_PORT_BAD_SIGNATURE = 3 };

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
	/* Signed commands (fence/auth: COSE_Sign1, ES256). With verify set,
	 * every command must be signed, as devices/shim with Options.Keys.
	 * sha256 hashes the concatenation of n parts into digest; 0 on
	 * success. verify checks sig (r || s, 64 bytes) over digest with the
	 * key named kid, for device: EFS_PORT_OK, EFS_PORT_UNKNOWN_KEY (no such
	 * key, or revoked), EFS_PORT_NOT_AUTHORISED (not for this device) or
	 * EFS_PORT_BAD_SIGNATURE. Both NULL: commands are plain envelopes. */
	int (*sha256)(void *user, const struct efs_bytes *parts, size_t n, uint8_t digest[32]);
	int (*verify)(void *user, const uint8_t *kid, size_t kid_len, const uint8_t *device, size_t device_len,
		const uint8_t digest[32], const uint8_t sig[64]);
	/* The operator's root: the one hook for what the root signs, the
	 * resets (efshim.h: efs_reset) and, on a firmware job's device, the
	 * image manifests (efshim_fw.h: efs_fw_port.root_kid). verify_root
	 * checks sig (r || s, ES256) over digest with the operator's root key,
	 * if kid is the root's: EFS_PORT_OK, EFS_PORT_UNKNOWN_KEY (kid is not
	 * the root's) or EFS_PORT_BAD_SIGNATURE. Resets need sha256 too
	 * (verify may be NULL: a device of plain commands takes resets;
	 * manifests are hashed by the library). NULL: every reset is refused
	 * (EFS_E_NO_ROOT), and so is every manifest. */
	int (*verify_root)(void *user, const uint8_t *kid, size_t kid_len, const uint8_t digest[32],
		const uint8_t sig[64]);
	/* The fleet epoch (fence/auth's epoch statement: a root-signed
	 * {1: epoch, 2: issued}, content type
	 * application/edgefence-epoch+cbor, carried in trust updates): the
	 * epoch of the newest statement the device's trust layer verified
	 * against the root and keeps, 0 if none. The trust layer keeps it
	 * durably before it counts (as the revocation list) and only raises
	 * it: a command of an earlier epoch is then refused stale whatever
	 * its token, one of a later epoch invalid ("unknown epoch ...") until
	 * its statement arrives. Asked at every decision, and only with
	 * verify set (as devices/shim, whose fleet epoch is its Keys'): a
	 * device of plain commands is at its last reset's epoch. NULL: none. */
	uint64_t (*epoch)(void *user);
} efs_port;

#endif
