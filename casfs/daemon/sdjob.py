"""Whether systemd is restarting casfsd's unit right now.

SIGTERM is all casfsd gets for ``systemctl stop`` and for ``systemctl
restart`` alike. A stop must unmount (the operator wants casfs gone); a restart
should leave the mount processes serving for the new casfsd to adopt
(casfs.node.lifeline), so no job sees it. systemd runs a restart as one job of
type ``restart`` whose stop half is under way while casfsd handles the SIGTERM:
``systemctl list-jobs`` shows it. Anything unclear (not under systemd, no
systemctl, no answer within a few seconds) is a stop.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

log = logging.getLogger(__name__)

RESTART_JOBS = frozenset({"restart", "try-restart", "reload-or-restart",
                          "try-reload-or-restart"})
TIMEOUT = 3.0


def own_unit(cgroup_file: str = "/proc/self/cgroup") -> str | None:
    """The systemd service this process runs in (its cgroup's last ``.service``)."""
    if "INVOCATION_ID" not in os.environ:  # set by systemd for what it starts
        return None
    try:
        with open(cgroup_file) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        path = line.split(":", 2)[-1]
        units = [p for p in path.split("/") if p.endswith(".service")]
        if units:
            return units[-1]
    return None


def restart_pending(unit: str | None = None) -> bool:
    """True if systemd has a restart job running for ``unit`` (default: our own)."""
    unit = unit or own_unit()
    systemctl = shutil.which("systemctl")
    if unit is None or systemctl is None:
        return False
    try:
        out = subprocess.run([systemctl, "list-jobs", "--plain", "--no-legend", "--no-pager",
                              unit], capture_output=True, text=True, timeout=TIMEOUT,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        log.info("cannot ask systemd whether %s restarts (%s): stopping", unit, e)
        return False
    return any(f[1] == unit and f[2] in RESTART_JOBS
               for f in (line.split() for line in out.splitlines()) if len(f) >= 3)
