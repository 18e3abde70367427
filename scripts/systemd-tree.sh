#!/usr/bin/env bash
# What tests/system/test_systemd.py boots: a Debian minbase tree with systemd as its
# init, and a wheelhouse to install casfs into it from (issue 24).
#
#   scripts/systemd-tree.sh tree             print the tree's path (built if missing)
#   scripts/systemd-tree.sh wheelhouse DIR   casfs's wheel, built from this checkout, and
#                                            every dependency for the tree's Python, with
#                                            the fuse extra (pyfuse3), into DIR
#
# The tree is this machine's release (bookworm), debootstrap --variant=minbase with
# systemd, systemd-sysv, dbus, procps (kill, for ExecReload=), python3, python3-venv and
# fuse3 (no compiler, no libfuse3-dev), cached in $CASFS_CI_CACHE (default
# /var/cache/casfs-ci, as scripts/wheel-check.sh's trees; root only). The first run
# needs deb.debian.org (~2 minutes); the tree is never written to afterwards: the
# test boots an overlay of it. pyfuse3 has no published wheels: it is built here once (this machine has the
# compiler and libfuse3-dev, scripts/bootstrap.sh) for the tree's Python minor
# version, which must be this machine's, and kept in the cache.
set -euo pipefail
ME=$(readlink -f "$0")
cd "$(dirname "$ME")/.."
REPO=$PWD
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
CACHE=${CASFS_CI_CACHE:-/var/cache/casfs-ci}
INCLUDE=systemd,systemd-sysv,dbus,procps,python3,python3-venv,fuse3

say() { echo "systemd-tree: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap)"
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9  # the same lock as scripts/wheel-check.sh: one builder at a time per cache

tree() {
    local suite dir stamp t0=$SECONDS
    suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    dir=$CACHE/$suite-systemd
    stamp="$suite minbase $INCLUDE"
    if [ "$(cat "$dir/.casfs-tree" 2>/dev/null)" != "$stamp" ]; then
        command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
        rm -rf --one-file-system "$dir" "$dir.tmp"
        local log
        log=$(mktemp /tmp/casfs-debootstrap.XXXXXX)
        debootstrap --variant=minbase --include="$INCLUDE" "$suite" "$dir.tmp" \
            "${CASFS_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$log" 2>&1 \
            || { tail -20 "$log" >&2; die "debootstrap $suite (log: $log)"; }
        rm -f "$log"
        rm -rf "$dir.tmp"/var/cache/apt/archives/*.deb
        echo casfs-ci >"$dir.tmp/etc/hostname"
        echo "$stamp" >"$dir.tmp/.casfs-tree"
        mv "$dir.tmp" "$dir"
        say "debootstrap $suite minbase + $INCLUDE: $dir in $((SECONDS - t0)) s"
    fi
    [ -x "$dir/lib/systemd/systemd" ] || die "$dir has no systemd"
    echo "$dir"
}

wheelhouse() {
    local wh=$1 root pyver here t0=$SECONDS
    root=$(tree)
    pyver=$(chroot "$root" /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    here=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$pyver" = "$here" ] || die "the tree's Python is $pyver, this machine's $here: pyfuse3 is built here"
    mkdir -p "$wh"
    rm -f "$wh"/casfs-*.whl
    # sdist, then the wheel from it (as scripts/wheel-check.sh): never from the checkout's
    # own build/ dir, whose stale copies would go into the wheel
    local dist
    dist=$(mktemp -d /tmp/casfs-sdist.XXXXXX)
    "$PYTHON" -m build --outdir "$dist" "$REPO" >"$wh/build.log" 2>&1 \
        || { tail -30 "$wh/build.log" >&2; rm -rf "$dist"; die "python -m build"; }
    mv "$dist"/casfs-*.whl "$wh/"
    rm -rf "$dist"
    # pyfuse3: built once for this Python minor version, then kept in the cache
    local fw=$CACHE/wheels-$pyver
    if ! ls "$fw"/pyfuse3-*.whl >/dev/null 2>&1; then
        mkdir -p "$fw"
        "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps -w "$fw" "pyfuse3>=3.3" \
            || die "building pyfuse3 (needs libfuse3-dev and a C compiler: scripts/bootstrap.sh)"
    fi
    cp "$fw"/pyfuse3-*.whl "$wh/"
    "$PYTHON" -m pip download -q --disable-pip-version-check --only-binary :all: \
        --python-version "$pyver" --find-links "$wh" -d "$wh" "$(ls "$wh"/casfs-*.whl)[fuse]" \
        >"$wh/download.log" 2>&1 || { tail -20 "$wh/download.log" >&2; die "pip download"; }
    say "wheelhouse for Python $pyver: $(ls "$wh"/*.whl | wc -l) wheels in $((SECONDS - t0)) s"
}

case ${1:-} in
    tree) tree ;;
    wheelhouse) [ $# = 2 ] || die "usage: systemd-tree.sh wheelhouse DIR"; wheelhouse "$2" ;;
    *) die "usage: systemd-tree.sh tree | wheelhouse DIR" ;;
esac
