/*
 * The device's application beside its firmware (fwjob's Config.Other): a
 * command whose kind does not start "fw." goes to the port's other check
 * instead of the job, behind the same fence point; accepted, the caller
 * applies it after the mark is stored (efshim_fw.h).
 */
#include "efs_fw_internal.h"

int efs_fw_is_other(const efs_fw_port *port, const efs_envelope *env)
{
	const efs_bytes k = env->kind;

	return port->other != NULL && !(k.n >= 3 && k.p[0] == 'f' && k.p[1] == 'w' && k.p[2] == '.');
}

int efs_fw_other_check(const efs_fw_port *port, const efs_envelope *env, efs_fw_text *t)
{
	const char *why = NULL;

	if (port->other(port->user, env, &why) == 0) {
		return 0;
	}
	efs_fw_add(t, why != NULL ? why : "refused by the application");
	return 1;
}
