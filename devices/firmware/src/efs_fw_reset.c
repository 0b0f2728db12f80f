/*
 * The operator's fence reset on a firmware job's device: efs_fw_handle is
 * efs_handle for efs_fw (devices/shim's Process in front of fwjob's
 * applier). A reset is answered by the fence point alone: its mark and
 * counter in one mark slot (one commit byte), the job record untouched, as
 * in Go, where the reset leaves fwjob's record as it is. The record's tag
 * carries the reset counter its step was stored under (efs_fw_record.c), so
 * efs_fw_open rolls the mark forward only within the same counter: a
 * lowered mark is never rolled back up at the next boot, and there is no
 * second write whose cut could leave the reset half applied. In a file of
 * its own: a firmware that never calls it does not link the reset's code.
 */
#include "efs_fw_internal.h"

void efs_fw_handle(efs_fw *fw, const uint8_t *device, size_t device_len, const uint8_t *buf, size_t n,
	efs_result *r)
{
	if (!efs_is_reset(buf, n)) {
		efs_fw_process(fw, device, device_len, buf, n, r);
		return;
	}
	fw->last = EFS_FW_OK;
	fw->other = 0;
	/* A record ahead of its mark in this session (a failed mark write, or
	 * a damaged record): the step it holds has no mark yet; a reset now
	 * would leave it never rolled forward. Refused until efs_fw_open. */
	efs_reset_process(fw->fence, device, device_len, buf, n, r, fw->broken ? EFS_E_STORAGE : EFS_OK);
}
