#!/bin/sh
# edgefence prerm. On removal, stop the agent (SIGTERM: it unlocks its
# devices and revokes its lease, so another gateway takes over at once).
# On upgrade it keeps running the old binary until the operator restarts it.
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
	if command -v deb-systemd-invoke >/dev/null 2>&1; then
		deb-systemd-invoke stop edgefence.service >/dev/null || true
	else
		systemctl stop edgefence.service >/dev/null 2>&1 || true
	fi
fi
exit 0
