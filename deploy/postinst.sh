#!/bin/sh
# edgefence postinst. Makes systemd see the new or changed unit; nothing
# more. The agent is not enabled and not started (an install must not begin
# taking device leases with an unedited config), and an upgrade does not
# restart it: a restart hands every device to another gateway, so the
# operator picks the moment. See README.md, "Install on a gateway".
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
