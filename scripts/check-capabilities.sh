#!/usr/bin/env bash
# Fail (never skip) when the machine lacks what the real-mount tests need.
# CASFS_ALLOW_NO_FUSE=1 turns the FUSE checks into warnings (for hosts without FUSE).
set -u
fail=0
check() {  # check "what" command...
    local what=$1; shift
    if ! "$@" >/dev/null 2>&1; then
        if [ "${CASFS_ALLOW_NO_FUSE:-0}" = 1 ]; then
            echo "capabilities: WARNING: $what missing (allowed by CASFS_ALLOW_NO_FUSE=1)" >&2
        else
            echo "capabilities: ERROR: $what missing; the real-mount tests need it" >&2
            fail=1
        fi
    fi
}
check "/dev/fuse (character device)" test -c /dev/fuse
check "fusermount3" command -v fusermount3
check "read/write access to /dev/fuse" test -r /dev/fuse -a -w /dev/fuse
check "a C++ compiler (g++)" command -v g++
exit $fail
