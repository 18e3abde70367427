#!/bin/sh
# Install casfsd on this node (docs/operations.md). Run as root from a casfs
# checkout or unpacked sdist:
#
#   sudo daemon/install.sh [--prefix /opt/casfs] [--python python3.11]
#                          [--from SPEC] [--no-fuse] [--enable] [--start]
#
# Creates a virtual environment under PREFIX, installs casfs into it (from
# this source tree, or SPEC, e.g. a wheel or "casfs==0.1.0") with its fuse
# extra (pyfuse3: builds against libfuse3-dev with a C compiler; --no-fuse:
# without, for nodes whose mounts are all mode = "dir"), symlinks casfsd
# and casfs into /usr/local/bin, installs the unit, tmpfiles.d entry and (only
# if none exists) the example configuration. It starts nothing unless asked:
# --enable enables the unit, --start (re)starts it. Run it again to upgrade.
set -eu

PREFIX=/opt/casfs
PYTHON=python3
SPEC=
FUSE=1
ENABLE=0
START=0
SRC=$(cd "$(dirname "$0")/.." && pwd)
BINDIR=/usr/local/bin
ETC=/etc/casfs
UNITDIR=/etc/systemd/system
TMPFILES=/etc/tmpfiles.d

while [ $# -gt 0 ]; do
    case $1 in
        --prefix) PREFIX=$2; shift 2 ;;
        --python) PYTHON=$2; shift 2 ;;
        --from) SPEC=$2; shift 2 ;;
        --no-fuse) FUSE=0; shift ;;
        --enable) ENABLE=1; shift ;;
        --start) START=1; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root" >&2; exit 1; }
[ -e /dev/fuse ] || echo "install.sh: warning: /dev/fuse is missing; casfsd needs FUSE" >&2
command -v fusermount3 >/dev/null 2>&1 || \
    echo "install.sh: warning: fusermount3 is missing (Debian/Ubuntu: apt install fuse3)" >&2

if [ ! -x "$PREFIX/bin/python" ]; then
    "$PYTHON" -m venv "$PREFIX"
fi
"$PREFIX/bin/python" -m pip install --quiet --upgrade pip
"$PREFIX/bin/python" -m pip install --quiet --upgrade "${SPEC:-$SRC}"
if [ "$FUSE" -eq 1 ]; then
    # the installed casfs's fuse extra (pyfuse3), whatever SPEC was
    "$PREFIX/bin/python" -m pip install --quiet "casfs[fuse]"
fi

ln -sf "$PREFIX/bin/casfsd" "$BINDIR/casfsd"
ln -sf "$PREFIX/bin/casfs" "$BINDIR/casfs"

install -d -m 0755 "$ETC" "$PREFIX/share/doc"
if [ ! -e "$ETC/casfs.toml" ]; then
    install -m 0644 "$SRC/daemon/casfs.toml" "$ETC/casfs.toml"
    echo "installed the example $ETC/casfs.toml: set store.root before starting"
fi
install -m 0644 "$SRC/daemon/casfsd.service" "$UNITDIR/casfsd.service"
install -m 0644 "$SRC/daemon/casfs-tmpfiles.conf" "$TMPFILES/casfs.conf"
for doc in configuration.md operations.md; do
    if [ -e "$SRC/docs/$doc" ]; then
        install -m 0644 "$SRC/docs/$doc" "$PREFIX/share/doc/$doc"
    fi
done

if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemd-tmpfiles --create "$TMPFILES/casfs.conf"
    systemctl daemon-reload
    if [ "$ENABLE" -eq 1 ]; then systemctl enable casfsd; fi
    if [ "$START" -eq 1 ]; then systemctl restart casfsd; fi
else
    echo "systemd is not running here: start casfsd yourself (casfsd --config $ETC/casfs.toml)"
fi
"$BINDIR/casfsd" --config "$ETC/casfs.toml" --check || \
    echo "install.sh: fix $ETC/casfs.toml (see docs/configuration.md) before starting" >&2
echo "$("$BINDIR/casfs" --version) installed in $PREFIX"
