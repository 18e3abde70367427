#!/usr/bin/env bash
# Run pytest; "no tests collected" (exit 5) is a failure, never a pass.
set -u
cd "$(dirname "$0")/.."
# --durations and faulthandler_timeout: if a test ever nears its 600 s timeout in CI,
# the log says which one and where every thread was (a stop's CI once failed with no log).
.venv/bin/python -m pytest -p no:cacheprovider -ra --durations=15 -o faulthandler_timeout=300 "$@"
rc=$?
if [ $rc -eq 5 ]; then
    echo "run-tests: ERROR: pytest collected no tests" >&2
    exit 1
fi
exit $rc
