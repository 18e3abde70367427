#!/usr/bin/env bash
# Run pytest; "no tests collected" (exit 5) is a failure, never a pass.
set -u
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -p no:cacheprovider -ra "$@"
rc=$?
if [ $rc -eq 5 ]; then
    echo "run-tests: ERROR: pytest collected no tests" >&2
    exit 1
fi
exit $rc
