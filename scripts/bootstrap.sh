#!/usr/bin/env bash
# Install everything casfs needs on a fresh Debian/Ubuntu machine: system packages
# (FUSE 3 and a C++ compiler for the real-client tests), then a virtual environment
# with casfs, the dev tools and the CPU builds of the real compilers.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
pkg-config --exists fuse3 2>/dev/null || need_apt+=(libfuse3-dev pkg-config)
command -v g++ >/dev/null || need_apt+=(g++)
command -v systemd-analyze >/dev/null || need_apt+=(systemd)
# tests/system: the wheel in Debian minbase trees without a compiler (scripts/wheel-check.sh)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
# tests/system/test_systemd.py: casfsd under a real systemd, booted in such a tree
command -v systemd-nspawn >/dev/null || need_apt+=(systemd-container)
# tests/system/test_report_page.py: casfs report's HTML page in a real headless Chromium
command -v chromium >/dev/null || need_apt+=(chromium)
# tests/*/test_site_cache*.py, bench.fleet --site-cache: a real nginx proxy_cache as a site
# cache (its own config and port; the package's system-wide server is stopped below)
[ -x /usr/sbin/nginx ] || need_apt+=(nginx)
# tests/view/test_dir_restore.py: dir mode's copies are reflinks on XFS (a loop-mounted one)
command -v mkfs.xfs >/dev/null || need_apt+=(xfsprogs)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "bootstrap: need root to install: ${need_apt[*]} (sudo apt-get install ${need_apt[*]})" >&2
        exit 1
    fi
    echo "bootstrap: installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
    if [[ " ${need_apt[*]} " == *" nginx "* ]] && [ -d /run/systemd/system ]; then
        systemctl disable --now nginx >/dev/null 2>&1 || true
    fi
fi
# tests/system/test_prometheus.py: Debian's Prometheus scrapes a real casfsd. Without its
# node exporter (a recommends); the test runs its own server, so the package's
# system-wide one is stopped where systemd started it.
if [ ! -x /usr/bin/prometheus ] && [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: warning: no prometheus (sudo apt-get install prometheus);" \
         "tests/system/test_prometheus.py will skip" >&2
elif [ ! -x /usr/bin/prometheus ]; then
    echo "bootstrap: installing prometheus"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    if [ -d /run/systemd/system ]; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv"
    "$PY" -m venv .venv
fi
VPIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
stamp=.venv/.casfs-deps
want="$(sha256sum pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "bootstrap: installing casfs and its dependencies into .venv"
    "${VPIP[@]}" -e ".[dev]"
    # The real clients, CPU builds (see ../shared/REAL_CLIENTS.md). Never an unpinned torch.
    if [ "${CASFS_NO_CLIENTS:-0}" != 1 ]; then
        "${VPIP[@]}" "torch==2.13.0+cpu" || "${VPIP[@]}" "torch==2.13.0"
        "${VPIP[@]}" --no-deps "triton==3.7.1"
    fi
    echo "$want" > "$stamp"
fi
