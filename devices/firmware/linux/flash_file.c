/*
 * flash_file.c: the efshim port of efsdev. Two "flash sectors" in one file
 * of the device's state dir; every erase and program is on the file
 * (fdatasync) before the call returns, so a mark efs_process reports
 * written survives kill -9 and a power cut of the host.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "efsdev.h"

/* full_io reads (write 0) or writes n bytes at off, through short counts
 * and EINTR. */
static int full_io(int fd, uint8_t *b, size_t n, off_t off, int write)
{
	while (n > 0) {
		ssize_t k = write ? pwrite(fd, b, n, off) : pread(fd, b, n, off);
		if (k < 0 && errno == EINTR) {
			continue;
		}
		if (k <= 0) {
			return -1;
		}
		b += k;
		n -= (size_t)k;
		off += k;
	}
	return 0;
}

static int flash_read(void *user, unsigned sector, uint32_t off, uint8_t *buf, size_t n)
{
	efsdev_flash *f = user;

	if (sector > 1 || off + n > EFSDEV_SECTOR) {
		return -1;
	}
	return full_io(f->fd, buf, n, (off_t)sector * EFSDEV_SECTOR + off, 0);
}

static int flash_erase(void *user, unsigned sector)
{
	efsdev_flash *f = user;
	uint8_t ff[EFSDEV_SECTOR];

	if (sector > 1) {
		return -1;
	}
	memset(ff, 0xFF, sizeof ff);
	if (full_io(f->fd, ff, sizeof ff, (off_t)sector * EFSDEV_SECTOR, 1) != 0) {
		return -1;
	}
	return fdatasync(f->fd);
}

static int flash_program(void *user, unsigned sector, uint32_t off, const uint8_t *buf, size_t n)
{
	efsdev_flash *f = user;

	if (sector > 1 || off + n > EFSDEV_SECTOR) {
		return -1;
	}
	if (full_io(f->fd, (uint8_t *)buf, n, (off_t)sector * EFSDEV_SECTOR + off, 1) != 0) {
		return -1;
	}
	return fdatasync(f->fd);
}

/* efsdev_flash_open opens the flash file, making an erased one (all 0xFF,
 * on disk before it returns) if it is missing or empty. */
int efsdev_flash_open(efsdev_flash *f, const char *path)
{
	struct stat st;

	f->fd = open(path, O_RDWR | O_CREAT, 0600);
	if (f->fd < 0 || fstat(f->fd, &st) != 0) {
		return -1;
	}
	if (st.st_size < 2 * (off_t)EFSDEV_SECTOR) {
		/* new, or its first erase cut short: nothing was programmed yet
		 * (programs come only after both sectors are erased here) */
		if (flash_erase(f, 0) != 0 || flash_erase(f, 1) != 0) {
			return -1;
		}
		return 0;
	}
	if (st.st_size != 2 * (off_t)EFSDEV_SECTOR) {
		errno = EINVAL;
		return -1;
	}
	return 0;
}

void efsdev_flash_port(efsdev_flash *f, efs_port *port)
{
	memset(port, 0, sizeof *port);
	port->user = f;
	port->sector_size = EFSDEV_SECTOR;
	port->flash_read = flash_read;
	port->flash_erase = flash_erase;
	port->flash_program = flash_program;
}
