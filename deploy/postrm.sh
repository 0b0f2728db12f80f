#!/bin/sh
# edgefence postrm. After removal systemd forgets the unit. Purge also
# removes what the operator and systemd made for it: the enablement link
# and the state directory (outbox.db, fence.db, twin.db — with
# DynamicUser=yes it lives in /var/lib/private/edgefence, and
# /var/lib/edgefence is systemd's symlink to it). dpkg removes the conffile.
set -e
if [ "$1" = purge ]; then
	rm -f /etc/systemd/system/multi-user.target.wants/edgefence.service
	rm -rf /var/lib/private/edgefence /var/lib/edgefence
fi
if { [ "$1" = remove ] || [ "$1" = purge ]; } && [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
