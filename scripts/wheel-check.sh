#!/usr/bin/env bash
# `pip install casfs` works without a C compiler or libfuse3, from the built wheel, not
# from this checkout (issue 24).
#
#   scripts/wheel-check.sh [--work DIR] [--no-demo] [host] [tree]
#
# Builds the sdist and the wheel (python -m build: the wheel is built from the sdist,
# so the sdist is complete), then resolves the wheel's whole dependency set as
# binaries only (pip download --only-binary :all:, plus torch==2.13.0+cpu for the
# demo). Then, in a fresh venv without the fuse extra, installed with --no-index
# --only-binary :all: from that wheelhouse, with the cwd outside the checkout and a
# clean environment:
#   casfs --help; casfs run --family generic -- sh -c ... (one warning line, then the
#   caches served in dir mode); casfs doctor (the same hint); python -m
#   casfs.demo.run_twice (needs torch; --no-demo or CASFS_WHEEL_CHECK_DEMO=0 skips it).
# Targets:
#   host  (default) here, with this machine's Python (the dev venv's base interpreter).
#   tree  in Debian minbase trees of this machine's release made by debootstrap and
#         cached under $CASFS_CI_CACHE (default /var/cache/casfs-ci; root only):
#         nocc:  python3 + python3-venv, no C compiler, no libfuse3-dev: install, help,
#                run, doctor;
#         torch: nocc + g++ + python3-dev (torch.compile on CPU compiles C++ at run time,
#                even on a cache hit; still no libfuse3-dev): the demo.
#         The first run needs deb.debian.org (~80 s a tree); later runs reuse them.
# Prints each stage's seconds; exits non-zero on the first failed check.
set -euo pipefail
ME=$(readlink -f "$0")

say() { echo "wheel-check: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }

FALLBACK="casfs: warning: FUSE support is not installed (pip install 'casfs[fuse]', needs libfuse3-dev and a C compiler); serving the caches as plain directories (dir mode)"
DOCTOR="WARN fuse        FUSE support is not installed (pip install 'casfs[fuse]', needs libfuse3-dev and a C compiler); casfs run serves the caches as plain directories (dir mode)"
TORCH="torch==2.13.0+cpu"  # never unpinned (scripts/bootstrap.sh)

# --- the checks, run in a clean environment (here or inside a tree) -----------------
# inner DIR WHEELHOUSE PYTHON DEMO: a fresh venv under DIR from PYTHON, the wheel from
# WHEELHOUSE only, the checks with DIR/home as cwd.
inner() {
    local dir=$1 wh=$2 py=$3 demo=$4 t0 out rc whl
    whl=$(ls "$wh"/casfs-*.whl)
    rm -rf "$dir/venv" "$dir/run" "$dir/home"
    mkdir -p "$dir/home" "$dir/run"
    # A short TMPDIR: the demo's second node keeps its state dir there, and its mount
    # processes' unix sockets under it (<= 107 bytes a path).
    TMPDIR=$(mktemp -d /tmp/casfs-wc.XXXXXX)
    trap 'rm -rf "$TMPDIR"' EXIT
    export TMPDIR CASFS_ROOT=$dir/run/root CASFS_STATE_DIR=$dir/run/state
    export CASFS_MOUNT_BASE=$dir/run/mnt
    cd "$dir/home"
    t0=$SECONDS
    "$py" -m venv "$dir/venv"
    local pip=("$dir/venv/bin/python" -m pip install -q --disable-pip-version-check
               --no-index --find-links "$wh" --only-binary :all:)
    "${pip[@]}" "$whl"
    say "installed $(basename "$whl") (no fuse extra) in $((SECONDS - t0)) s"
    "$dir/venv/bin/python" - "$dir/venv" <<'EOF'
import importlib.util, os, sys
import casfs
venv = os.path.realpath(sys.argv[1])
assert os.path.realpath(casfs.__file__).startswith(venv + os.sep), casfs.__file__
assert importlib.util.find_spec("pyfuse3") is None, "pyfuse3 is installed"
print(f"wheel-check: casfs imported from {casfs.__file__}, no pyfuse3", file=sys.stderr)
EOF
    "$dir/venv/bin/casfs" --help >/dev/null || die "casfs --help"

    # shellcheck disable=SC2016  # expanded by the job's shell, not here
    out=$("$dir/venv/bin/casfs" run --family generic -- sh -c 'echo x > "$CASFS_CACHE_DIR/f"' \
          2>&1) || die "casfs run: $out"
    printf '%s\n' "$out" >&2
    [ "$(grep -cxF "$FALLBACK" <<<"$out")" = 1 ] || die "casfs run: not the one fallback line"
    [ "$(grep -c 'warning' <<<"$out")" = 1 ] || die "casfs run: more warnings than the fallback"
    grep -q "generic: .* 1 published" <<<"$out" || die "casfs run: the cache was not published"

    rc=0
    out=$("$dir/venv/bin/casfs" doctor 2>&1) || rc=$?
    printf '%s\n' "$out" >&2
    grep -qxF "$DOCTOR" <<<"$out" || die "casfs doctor: no FUSE hint"
    [ $rc = 0 ] || die "casfs doctor exited $rc"

    if [ "$demo" = 1 ]; then
        t0=$SECONDS
        "${pip[@]}" "$TORCH"
        say "installed $TORCH in $((SECONDS - t0)) s"
        t0=$SECONDS
        rc=0
        out=$("$dir/venv/bin/python" -m casfs.demo.run_twice 2>&1) || rc=$?
        printf '%s\n' "$out" >&2
        [ $rc = 0 ] || die "python -m casfs.demo.run_twice exited $rc"
        [ "$(grep -cxF "$FALLBACK" <<<"$out")" = 2 ] || die "demo: not one fallback line a run"
        say "python -m casfs.demo.run_twice: ok in $((SECONDS - t0)) s"
    fi
}

if [ "${1:-}" = --inner ]; then
    shift
    inner "$@"
    exit 0
fi

# --- the outer script -----------------------------------------------------------------
cd "$(dirname "$ME")/.."
REPO=$PWD
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
DEMO=${CASFS_WHEEL_CHECK_DEMO:-1}
CACHE=${CASFS_CI_CACHE:-/var/cache/casfs-ci}
WORK=""
targets=()
while [ $# -gt 0 ]; do
    case $1 in
        --work) WORK=$2; shift ;;
        --no-demo) DEMO=0 ;;
        host|tree) targets+=("$1") ;;
        *) die "unknown argument $1 (usage: wheel-check.sh [--work DIR] [--no-demo] [host] [tree])" ;;
    esac
    shift
done
[ ${#targets[@]} -gt 0 ] || targets=(host)
MOUNTS=()  # unmounted on exit, newest first, before anything under them is removed
KEEP=1
unmount_all() {
    local i
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
        umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" 2>/dev/null || true
    done
    MOUNTS=()
}
# Everything mounted at or below $1, deepest first.
unmount_under() {
    local m
    awk -v d="$1" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | sort -r |
        while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
}
cleanup() {
    unmount_all
    [ "$KEEP" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
if [ -z "$WORK" ]; then
    WORK=$(mktemp -d /tmp/casfs-wheel-check.XXXXXX)
    KEEP=0
fi
mkdir -p "$WORK"
WORK=$(readlink -f "$WORK")
case $WORK/ in "$REPO"/*) die "--work must be outside the checkout" ;; esac

T0=$SECONDS
t0=$SECONDS
rm -rf "$WORK/dist"
"$PYTHON" -m build --outdir "$WORK/dist" "$REPO" >"$WORK/build.log" 2>&1 \
    || { tail -30 "$WORK/build.log" >&2; die "python -m build"; }
ls "$WORK"/dist/casfs-*.tar.gz "$WORK"/dist/casfs-*-py3-none-any.whl >/dev/null \
    || die "python -m build made no sdist or no pure-Python wheel"
say "built $(cd "$WORK/dist" && echo *) in $((SECONDS - t0)) s"
"$PYTHON" - "$WORK"/dist/casfs-*.whl <<'EOF' || die "the wheel's contents"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert "casfs/demo/run_twice.py" in names and "casfs/py.typed" in names, "no demo or py.typed"
assert not [n for n in names if n.startswith("tests/")], "the wheel ships tests/"
EOF

# The wheel's dependencies for interpreter $1 (e.g. 3.11), binaries only, into $2.
wheelhouse() {
    local pyver=$1 wh=$2 t0=$SECONDS
    local want=("$WORK"/dist/casfs-*.whl)
    [ "$DEMO" = 1 ] && want+=("$TORCH")
    mkdir -p "$wh"
    cp "$WORK"/dist/casfs-*.whl "$wh/"
    if ! "$PYTHON" -m pip download -q --disable-pip-version-check --only-binary :all: \
            --python-version "$pyver" -d "$wh" "${want[@]}" >"$WORK/download.log" 2>&1; then
        grep -v 'is ignored' "$WORK/download.log" >&2 || true
        die "a dependency has no wheel for Python $pyver (pip would need to build it)"
    fi
    say "Python $pyver wheelhouse: $(ls "$wh" | wc -l) wheels, all binary, in $((SECONDS - t0)) s"
}

clean_env=(env -i PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8)

check_host() {
    local base pyver
    base=$("$PYTHON" -c 'import os, sys; print(os.path.join(sys.base_prefix, "bin", "python3"))')
    pyver=$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    wheelhouse "$pyver" "$WORK/wh-$pyver"
    say "host: $base (Python $pyver)"
    "${clean_env[@]}" HOME="$WORK/host/home" bash "$ME" --inner "$WORK/host" "$WORK/wh-$pyver" \
        "$base" "$DEMO"
    say "host: ok"
}

# A Debian minbase tree of this machine's release with $2 (comma-separated), cached.
tree() {
    local name=$1 include=$2 suite dir stamp
    suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    dir=$CACHE/$suite-$name
    stamp="$suite minbase $include"
    if [ "$(cat "$dir/.casfs-tree" 2>/dev/null)" != "$stamp" ]; then
        command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
        local t0=$SECONDS
        unmount_under "$dir"
        rm -rf --one-file-system "$dir" "$dir.tmp"
        debootstrap --variant=minbase --include="$include" "$suite" "$dir.tmp" \
            "${CASFS_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$WORK/debootstrap-$name.log" 2>&1 \
            || { tail -20 "$WORK/debootstrap-$name.log" >&2; die "debootstrap $name"; }
        rm -rf "$dir.tmp"/var/cache/apt/archives/*.deb
        echo "$stamp" >"$dir.tmp/.casfs-tree"
        mv "$dir.tmp" "$dir"
        say "debootstrap $suite minbase + $include: $dir in $((SECONDS - t0)) s"
    fi
    echo "$dir"
}

# Run the checks inside tree $1; $2: run the demo.
in_tree() {
    local root=$1 demo=$2 pyver
    [ -x "$root/usr/bin/python3" ] || die "$root has no python3"
    pyver=$(chroot "$root" /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    wheelhouse "$pyver" "$WORK/wh-$pyver"
    local box=$root/casfs-check
    unmount_under "$root"  # left by a check that was killed
    rm -rf --one-file-system "$box"
    mkdir -p "$box/wh" "$box/home"
    cp "$ME" "$box/wheel-check.sh"
    # the wheelhouse goes in by bind mount (torch is ~200 MB); /proc: casfs reads it
    mount --bind "$WORK/wh-$pyver" "$box/wh"
    MOUNTS+=("$box/wh")
    mount -t proc proc "$root/proc"
    MOUNTS+=("$root/proc")
    local rc=0
    chroot "$root" "${clean_env[@]}" HOME=/casfs-check/home bash /casfs-check/wheel-check.sh \
        --inner /casfs-check /casfs-check/wh /usr/bin/python3 "$demo" || rc=$?
    unmount_all  # then the box can go
    rm -rf --one-file-system "$box"
    [ $rc = 0 ] || die "in $root"
}

check_tree() {
    [ "$(id -u)" = 0 ] || die "tree: needs root (debootstrap, chroot, mount)"
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock 9  # one check at a time per cache: the trees are shared
    local nocc torchroot cc
    nocc=$(tree nocc python3,python3-venv)
    for cc in cc gcc g++ c++ clang; do
        [ ! -e "$nocc/usr/bin/$cc" ] || die "$nocc has a compiler: /usr/bin/$cc"
    done
    [ ! -e "$nocc/usr/include/fuse3" ] || die "$nocc has libfuse3-dev"
    say "tree nocc: $nocc (no C compiler, no libfuse3-dev)"
    in_tree "$nocc" 0
    say "tree nocc: ok"
    if [ "$DEMO" = 1 ]; then
        torchroot=$(tree torch python3,python3-venv,g++,python3-dev)
        [ ! -e "$torchroot/usr/include/fuse3" ] || die "$torchroot has libfuse3-dev"
        say "tree torch: $torchroot (g++ and python3-dev for torch.compile, no libfuse3-dev)"
        in_tree "$torchroot" 1
        say "tree torch: ok"
    fi
    exec 9>&-
}

for t in "${targets[@]}"; do
    t0=$SECONDS
    "check_$t"
    say "$t: $((SECONDS - t0)) s"
done
say "ok in $((SECONDS - T0)) s"
