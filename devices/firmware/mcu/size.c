/*
 * The smallest firmware that fences, for the size figures (mcu_test.go's
 * TestMCUSize): boot, then for every message from the transport decide,
 * apply, and send the ack. Linked as a firmware build would be (-Os, LTO,
 * --gc-sections, newlib-nano's memcpy and memset) twice: with the library
 * (EFS_SIZE_LIB=1) and without it (0: the same board, port, buffers and
 * state, the library's calls left out). The difference is what the library
 * costs in flash and in static RAM. EFS_SIZE_SIGNED adds a crypto port
 * (stubs, in both images: the crypto itself is mbedTLS's, measured apart);
 * with EFS_SIZE_MBEDTLS too, the port's crypto is real: test/port_mbedtls.c's
 * SHA-256 and ES256 verify on mbedTLS built for the target
 * (mcu/mbedtls_config.h), its heap a static buffer of EFS_SIZE_CRYPTO_HEAP
 * bytes, one provisioned key: against the stubs' image, what the crypto
 * costs.
 * EFS_SIZE_FW is a device that takes firmware jobs (efshim_fw.h): boot
 * through the boot loader's decision, every command a firmware step; its
 * image slots and job record on the same stand-in flash.
 *
 * Not run: the board's flash, transport and effect are compiler barriers;
 * mcu/startup.c is the reset.
 */
#include <stdint.h>
#include <string.h>

#include "efshim.h"
#include "efshim_fw.h"

#define SECTOR 4096u
#define FLASH ((uint8_t *)0x00300000u) /* mps2 code SRAM, standing in for two flash sectors */

/* barrier: the compiler must assume p's memory is read and written here. */
#define barrier(p) __asm__ volatile("" : : "r"(p) : "memory")

static int flash_read(void *u, unsigned s, uint32_t off, uint8_t *b, size_t n)
{
	(void)u;
	memcpy(b, FLASH + s * SECTOR + off, n);
	return 0;
}

static int flash_erase(void *u, unsigned s)
{
	(void)u;
	memset(FLASH + s * SECTOR, 0xff, SECTOR);
	return 0;
}

static int flash_program(void *u, unsigned s, uint32_t off, const uint8_t *b, size_t n)
{
	uint8_t *p = FLASH + s * SECTOR + off;

	(void)u;
	for (size_t i = 0; i < n; i++) {
		p[i] &= b[i];
	}
	return 0;
}

#if defined(EFS_SIZE_SIGNED) && defined(EFS_SIZE_MBEDTLS)
#include "mbedtls/memory_buffer_alloc.h"
#define EFS_PORT_CRYPTO_ONLY
#include "../test/port_mbedtls.c"

#ifndef EFS_SIZE_CRYPTO_HEAP
#define EFS_SIZE_CRYPTO_HEAP 6400
#endif
static unsigned char crypto_heap[EFS_SIZE_CRYPTO_HEAP] __attribute__((aligned(8)));

/* The key store: one gateway key, provisioned in flash with its kid. */
static const uint8_t gw_kid[] = "gateway-1";
static const uint8_t gw_point[65] = { 0x04 };

static int sha256(void *u, const struct efs_bytes *parts, size_t n, uint8_t digest[32])
{
	return port_sha256(u, parts, n, digest);
}

static int verify(void *u, const uint8_t *kid, size_t kid_len, const uint8_t *dev, size_t dev_len,
	const uint8_t digest[32], const uint8_t sig[64])
{
	(void)u;
	(void)dev;
	(void)dev_len;
	if (kid_len != sizeof gw_kid - 1 || memcmp(kid, gw_kid, kid_len) != 0) {
		return EFS_PORT_UNKNOWN_KEY;
	}
	return es256_verify(gw_point, sizeof gw_point, digest, sig) == 0 ? EFS_PORT_OK : EFS_PORT_BAD_SIGNATURE;
}
#elif defined(EFS_SIZE_SIGNED)
static int sha256(void *u, const struct efs_bytes *parts, size_t n, uint8_t digest[32])
{
	(void)u;
	barrier(parts);
	barrier(digest);
	return (int)n - 5;
}

static int verify(void *u, const uint8_t *kid, size_t kid_len, const uint8_t *dev, size_t dev_len,
	const uint8_t digest[32], const uint8_t sig[64])
{
	(void)u;
	barrier(kid);
	barrier(dev);
	barrier(digest);
	barrier(sig);
	return (int)(kid_len + dev_len) & 3;
}
#endif

#ifdef EFS_SIZE_SIGNED
/* fleet_epoch: the fleet epoch the trust layer keeps (a stand-in). */
static uint64_t fleet_epoch(void *u)
{
	uint64_t e = 0;

	(void)u;
	barrier(&e);
	return e;
}
#endif

static const efs_port port = {
	.sector_size = SECTOR,
	.flash_read = flash_read,
	.flash_erase = flash_erase,
	.flash_program = flash_program,
#ifdef EFS_SIZE_SIGNED
	.sha256 = sha256,
	.verify = verify,
	.epoch = fleet_epoch,
#endif
};

#ifdef EFS_SIZE_FW
#define SLOT (64u * 1024u)

static int slot_read(void *u, unsigned s, uint32_t off, uint8_t *b, size_t n)
{
	(void)u;
	memcpy(b, FLASH + 2 * SECTOR + s * SLOT + off, n);
	return 0;
}

static int slot_erase(void *u, unsigned s)
{
	(void)u;
	memset(FLASH + 2 * SECTOR + s * SLOT, 0xff, SLOT);
	return 0;
}

static int slot_program(void *u, unsigned s, uint32_t off, const uint8_t *b, size_t n)
{
	return flash_program(u, 0, 2 * SECTOR + s * SLOT + off, b, n);
}

static int rec_read(void *u, unsigned s, uint32_t off, uint8_t *b, size_t n)
{
	return flash_read(u, 0, 2 * SECTOR + 2 * SLOT + s * SECTOR + off, b, n);
}

static int rec_erase(void *u, unsigned s)
{
	(void)u;
	memset(FLASH + 4 * SECTOR + 2 * SLOT + s * SECTOR, 0xff, SECTOR);
	return 0;
}

static int rec_program(void *u, unsigned s, uint32_t off, const uint8_t *b, size_t n)
{
	return flash_program(u, 0, 2 * SECTOR + 2 * SLOT + s * SECTOR + off, b, n);
}

static const efs_fw_port fwport = {
	.slot_size = SLOT,
	.record_sector_size = SECTOR,
	.slot_read = slot_read,
	.slot_erase = slot_erase,
	.slot_program = slot_program,
	.record_read = rec_read,
	.record_erase = rec_erase,
	.record_program = rec_program,
	.factory_size = 1024,
};

static efs_fw fw;
#endif

static efs_ctx ctx;
static efs_result res;
static uint8_t rx[512], tx[512];
static const uint8_t device[] = "dev";

static size_t receive(void)
{
	size_t n = 0;

	barrier(rx);
	barrier(&n);
	return n;
}

int main(void);
int main(void)
{
#if defined(EFS_SIZE_SIGNED) && defined(EFS_SIZE_MBEDTLS)
	mbedtls_memory_buffer_alloc_init(crypto_heap, sizeof crypto_heap);
#endif
#if EFS_SIZE_LIB
	efs_ack ack;
	size_t len;

	efs_open(&ctx, &port);
#ifdef EFS_SIZE_FW
	efs_fw_boot_info boot;

	efs_fw_open(&fw, &fwport, &ctx);
	efs_fw_boot(&fw, &boot);
	barrier(&boot); /* the jump to the slot */
	if (boot.trial) {
		efs_fw_health(&fw, (int)receive(), NULL);
	}
#endif
	for (;;) {
#ifdef EFS_SIZE_FW
		efs_fw_process(&fw, device, sizeof device - 1, rx, receive(), &res);
		if (efs_fw_reboot_pending(&fw)) {
			barrier(&fw); /* the reboot */
		}
#else
		efs_process(&ctx, device, sizeof device - 1, rx, receive(), &res);
#endif
		if (res.apply) {
			barrier(&res.env); /* the effect */
		}
		efs_result_ack(&res, &ack);
		if (efs_encode_ack(&ack, tx, sizeof tx, &len) == EFS_OK) {
			barrier(tx); /* the transport */
		}
	}
#else
	barrier(&port);
	barrier(&ctx);
#ifdef EFS_SIZE_FW
	barrier(&fwport);
	barrier(&fw);
#endif
	for (;;) {
		size_t n = receive();

		barrier(&res);
		barrier(device);
		memcpy(tx, rx, n);
		barrier(tx);
	}
#endif
}
