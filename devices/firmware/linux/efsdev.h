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

#endif
