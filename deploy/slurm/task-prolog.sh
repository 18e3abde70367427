#!/bin/sh
# Slurm TaskProlog for casfs (docs/operations.md, "Slurm").
#
# slurm.conf:   TaskProlog=/etc/casfs/slurm-task-prolog.sh
#
# Runs as the job's user right before each task starts; every line it prints
# as "export NAME=value" goes into the task's environment. `casfs env` asks
# the node's casfsd (jobs socket) for this user's caches of this stack and
# prints TRITON_CACHE_DIR=..., TORCHINDUCTOR_CACHE_DIR=..., CASFS_LEASE=...;
# the lease follows the task's process, and casfsd publishes and releases the
# namespace after the last task of that stack on the node is gone.
#
# Any failure means an uncached task, never a failed one: this script always
# exits 0 and prints nothing it is not sure of.
CASFS=${CASFS:-casfs}
FAMILIES=${CASFS_FAMILIES:-triton,inductor}
SOCKET=${CASFS_SOCKET:-/run/casfs/casfsd.sock}

[ -S "$SOCKET" ] || exit 0
[ -n "${SLURM_TASK_PID:-}" ] || exit 0
out=$("$CASFS" env --pid "$SLURM_TASK_PID" --family "$FAMILIES" 2>/dev/null) || exit 0
printf '%s\n' "$out" | grep '^export [A-Z_][A-Z0-9_]*=' || true
exit 0
