"""Per-tenant quotas on the node's uppers ([quota]; docs/configuration.md, docs/security.md).

* The policy (``QuotaPolicy``): a byte and an inode bound per tenant, the
  state filesystem's reserve, and the mechanism for the modes the kernel writes.
* fuse mode: the view counts (casfs.view.quota). ``tenant_quota(cfg)`` is the
  process's one ``TenantQuota`` of a tenant, shared by the views of all its
  namespaces (a node's host serves many); the state filesystem's ``Reserve``
  is shared by all tenants of the process.
* overlay and dir modes (the kernel or the job writes directly; nothing in
  casfs sees the writes): mechanism ``"loopfs"`` gives each tenant its own
  ext4 filesystem, ``<state>/quota/<tenant>.img`` (preallocated: it never grows
  on the state filesystem), loop-mounted at ``<state>/quota/<tenant>/``. The
  tenant's uppers (every mode), overlay work dirs and dir-mode directories
  (bind-mounted at the mount point) live there: a writer past the bound gets
  ENOSPC from the kernel, and nothing else shares that filesystem.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import subprocess
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from casfs.errors import CasfsError
from casfs.util.diskroom import default_reserve, fs_size
from casfs.util.flock import try_flock
from casfs.view.quota import NamespaceQuota, Reserve, TenantQuota

log = logging.getLogger(__name__)

MECHANISMS = ("none", "loopfs")
DEFAULT_BYTES = 0.10  # of the state filesystem, per tenant
DEFAULT_INODES = 1_000_000
MNT_DETACH = 2
MS_BIND = 4096


@dataclass(frozen=True)
class QuotaPolicy:
    """[quota]: ``bytes`` and ``reserve`` are a byte count (int) or a fraction of the
    state filesystem's size (float, 0 < f <= 1); ``bytes``/``inodes`` None: no bound;
    ``reserve`` None: the default, min(max(1 GiB, 5%), 10%) of the filesystem."""

    bytes: int | float | None = DEFAULT_BYTES
    inodes: int | None = DEFAULT_INODES
    reserve: int | float | None = None
    mechanism: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> QuotaPolicy:
        if not d:
            return cls()
        return cls(**{k: d[k] for k in ("bytes", "inodes", "reserve", "mechanism") if k in d})

    def tenant_bytes(self, state_dir: Path) -> int | None:
        return _resolve(self.bytes, state_dir)

    def reserve_bytes(self, state_dir: Path) -> int:
        if self.reserve is None:
            return default_reserve(state_dir)
        return _resolve(self.reserve, state_dir) or 0


def _resolve(v: int | float | None, state_dir: Path) -> int | None:
    if v is None or v == 0:
        return None
    if isinstance(v, float):
        return int(fs_size(state_dir) * v)
    return int(v)


# --- fuse mode: the counts of this process ------------------------------------------------
_lock = threading.Lock()
_tenants: dict[tuple[str, str], TenantQuota] = {}
_reserves: dict[str, Reserve] = {}


def tenant_quota(cfg: Any) -> TenantQuota | None:
    """The process's count of ``cfg.tenant``'s uppers (a MountConfig), None without tenants
    or with nothing to bound."""
    policy = QuotaPolicy.from_dict(cfg.quota)
    state = Path(cfg.state_dir)
    reserve_bytes = policy.reserve_bytes(state)
    max_bytes = policy.tenant_bytes(state) if cfg.tenant else None
    max_inodes = policy.inodes if cfg.tenant else None
    upper_root = Path(cfg.upper).parent
    upper_root.mkdir(parents=True, exist_ok=True)
    # The reserve is the state filesystem's: a tenant filesystem (loopfs) is not on it.
    on_state = os.stat(upper_root).st_dev == os.stat(state).st_dev
    if max_bytes is None and max_inodes is None and not (reserve_bytes and on_state):
        return None
    key = (str(upper_root), cfg.tenant)
    with _lock:
        q = _tenants.get(key)
        if q is None:
            reserve = None
            if reserve_bytes and on_state:
                reserve = _reserves.get(str(state))
                if reserve is None:
                    reserve = _reserves[str(state)] = Reserve(state, reserve_bytes)
            q = _tenants[key] = TenantQuota(cfg.tenant or "-", upper_root, max_bytes=max_bytes,
                                            max_inodes=max_inodes, reserve=reserve)
    return q


def attach(cfg: Any) -> NamespaceQuota | None:
    """Count the upper of ``cfg``'s namespace from now on (scanned now); None: not counted."""
    q = tenant_quota(cfg)
    if q is None:
        return None
    return q.attach(Path(cfg.upper).name, Path(cfg.upper))


# --- overlay and dir modes: a filesystem per tenant (mechanism "loopfs") ------------------
def loopfs_unavailable() -> str | None:
    """Why tenant filesystems cannot be made here (one line), or None."""
    if os.geteuid() != 0:
        return "needs root (it mounts a filesystem per tenant)"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            return f"{tool} is not installed (apt-get install e2fsprogs mount)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices here (/dev/loop-control is missing; modprobe loop)"
    return None


def _tool(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or name


def _run(args: list[str]) -> None:
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    if r.returncode != 0:
        raise CasfsError(f"{' '.join(args[:2])}: {(r.stderr or r.stdout).strip()[:300]}")


class TenantFs:
    """One tenant's filesystem: ``<state>/quota/<tenant>.img``, mounted at
    ``<state>/quota/<tenant>/``; made and mounted by the first of the tenant's
    namespaces served, by any process of the node (under ``<tenant>.lock``), and
    left mounted for the next (the image keeps its files across restarts)."""

    def __init__(self, state_dir: Path, tenant: str, size: int, inodes: int | None,
                 reserve: int = 0) -> None:
        self.base = Path(state_dir) / "quota"
        self.tenant = tenant
        self.size = size
        self.inodes = inodes
        self.reserve = reserve

    @property
    def image(self) -> Path:
        return self.base / f"{self.tenant}.img"

    @property
    def path(self) -> Path:
        return self.base / self.tenant

    def ensure(self) -> Path:
        why = loopfs_unavailable()
        if why is not None:
            raise CasfsError(f"quota mechanism \"loopfs\": {why}")
        self.base.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.base / f"{self.tenant}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        try:
            import fcntl

            if not try_flock(fd):
                fcntl.flock(fd, fcntl.LOCK_EX)  # another process makes or mounts it now
            if not os.path.ismount(self.path):
                self._make()
                self.path.mkdir(mode=0o700, exist_ok=True)
                _run([_tool("mount"), "-t", "ext4", "-o", "loop,nodev,nosuid", str(self.image),
                      str(self.path)])
                os.chmod(self.path, 0o700)
                log.info("tenant %s: its filesystem (%d MiB) mounted at %s", self.tenant,
                         self.size >> 20, self.path)
            have = self.image.stat().st_size
            if have != self.size:
                log.warning("tenant %s: its filesystem is %d bytes, [quota] says %d: the new"
                            " bound applies once %s is removed (its namespaces released)",
                            self.tenant, have, self.size, self.image)
        finally:
            os.close(fd)
        return self.path

    def _make(self) -> None:
        if self.image.exists():
            return
        free = os.statvfs(self.base).f_bavail * os.statvfs(self.base).f_frsize
        if free - self.size < self.reserve:
            raise CasfsError(f"tenant {self.tenant}: no room for its filesystem of"
                             f" {self.size} bytes on {self.base} ({free} free, {self.reserve}"
                             " kept in reserve)")
        tmp = self.image.with_suffix(".img.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, self.size)  # allocated now: never grows later
        except OSError as e:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise CasfsError(f"tenant {self.tenant}: cannot allocate its filesystem: {e}") from e
        os.close(fd)
        # nodiscard: mkfs would punch the preallocated blocks out of the image again
        args = [_tool("mkfs.ext4"), "-q", "-F", "-b", "4096", "-m", "0", "-E", "nodiscard"]
        if self.inodes:
            args += ["-N", str(self.inodes)]
        try:
            _run([*args, str(tmp)])
        except CasfsError:
            tmp.unlink(missing_ok=True)
            raise
        os.rename(tmp, self.image)


def tenant_fs(cfg: Any) -> TenantFs | None:
    """The tenant filesystem ``cfg`` (a MountConfig) is to use, None if not "loopfs"."""
    if cfg.quota_fs is None:
        return None
    policy = QuotaPolicy.from_dict(cfg.quota)
    size = policy.tenant_bytes(cfg.state_dir)
    if size is None:
        raise CasfsError("quota mechanism \"loopfs\" needs a byte bound (quota.bytes)")
    return TenantFs(cfg.state_dir, cfg.tenant, size, policy.inodes,
                    policy.reserve_bytes(cfg.state_dir))


def prepare(cfg: Any) -> None:
    """Before a mount makes its writable directory: the tenant's filesystem mounted
    (mechanism "loopfs"), and in dir mode its directory there bind-mounted at the
    mount point (a bind of it already there is kept: a predecessor's, or a crash's)."""
    fs = tenant_fs(cfg)
    if fs is None:
        return
    top = fs.ensure()
    if cfg.mode != "dir":
        return
    src = top / "dir" / cfg.namespace
    src.mkdir(parents=True, exist_ok=True)
    mp = Path(cfg.mountpoint)
    mp.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(mp):
        st, want = os.stat(mp), os.stat(src)
        if st.st_dev != want.st_dev:
            raise CasfsError(f"{mp}: another filesystem is mounted there (not the tenant's)")
        if st.st_ino == want.st_ino:
            return  # our bind, left to us by a predecessor (a handover) or by a crash
        unbind(mp)  # a bind of another directory of the tenant's filesystem
    from casfs.util.libc import libc

    if libc().mount(os.fsencode(src), os.fsencode(mp), None, MS_BIND, None) != 0:
        e = ctypes.get_errno()
        raise CasfsError(f"cannot bind the tenant's directory at {mp}: {os.strerror(e)}")


def unbind(mp: Path) -> None:
    """Detach dir mode's bind of the tenant's directory (files still open keep working)."""
    from casfs.util.libc import libc

    if libc().umount2(os.fsencode(mp), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):
            log.warning("unmounting %s: %s", mp, os.strerror(e))


def release_dir(cfg: Any) -> None:
    """At a dir-mode mount's close: its bind goes (mechanism "loopfs")."""
    if cfg.quota_fs is not None and cfg.mode == "dir":
        with contextlib.suppress(OSError):
            unbind(Path(cfg.mountpoint))


def unmount_all(state_dir: Path) -> list[str]:
    """Unmount every tenant filesystem of ``state_dir`` (an operator's cleanup, tests);
    the images stay. The tenants mounted before."""
    base = Path(state_dir) / "quota"
    done: list[str] = []
    try:
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return done
    for e in entries:
        if e.is_dir(follow_symlinks=False) and os.path.ismount(e.path):
            _run([_tool("umount"), "-l", e.path])
            done.append(e.name)
    return done
