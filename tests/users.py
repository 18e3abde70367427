"""Real unix users for tenant tests: created with useradd, removed in finally.

Commands run as a user through ``setpriv`` (real uid, gid and supplementary
groups, like a job started by Slurm or a login shell). The interpreter must be
one the user can execute: the venv's own if its path is open to everyone,
otherwise the system python of the same minor version with the venv's
site-packages on PYTHONPATH (a pyenv under /root is not reachable by users).
A checkout users cannot enter (``mktemp -d`` is 0700, as the checkout or one of
its parents) is opened for traversal only (o+x, until exit), bind-mounted at an
open path when a parent is closed, and imported through links, so they run the
same code.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def _world_executable(path: str) -> bool:
    p = Path(path).resolve()
    for d in [p, *p.parents]:
        try:
            mode = d.stat().st_mode
        except OSError:
            return False
        if not mode & 0o001:
            return False
    return True


@functools.cache
def _open_repo() -> Path:
    """REPO, or a bind mount of it at a path every user can traverse."""
    mode = REPO.stat().st_mode
    if not mode & 0o001:  # the checkout itself is 0700 (``mktemp -d``): users may
        os.chmod(REPO, mode | 0o001)  # pass through it (no listing), until exit
        atexit.register(os.chmod, REPO, mode)
    if _world_executable(str(REPO)):
        return REPO
    d = Path(tempfile.mkdtemp(prefix="casfs-repo-"))
    os.chmod(d, 0o755)
    subprocess.run(["mount", "--bind", str(REPO), str(d)], check=True, capture_output=True)

    def _unbind() -> None:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)
        with contextlib.suppress(OSError):
            d.rmdir()

    atexit.register(_unbind)
    return d


def _reachable(path: str) -> str:
    """``path`` as users can reach it: through the bind mount when it lies in REPO."""
    p = Path(path)
    try:
        rel = p.relative_to(REPO)
    except ValueError:
        return path
    return str(_open_repo() / rel)


@functools.cache
def _import_dir() -> str:
    """A PYTHONPATH entry users import the checkout's packages from. Python lists
    each entry to find modules, so a checkout they may only pass through looks
    empty: then a directory of links to its packages stands in."""
    base = _open_repo()
    if REPO.stat().st_mode & 0o004:
        return str(base)
    d = Path(tempfile.mkdtemp(prefix="casfs-import-"))
    os.chmod(d, 0o755)
    for name in ("casfs", "tests", "bench"):
        (d / name).symlink_to(base / name)
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return str(d)


def user_python() -> tuple[str, str]:
    """(interpreter, PYTHONPATH) that any user can run casfs with."""
    paths = [_import_dir(), *(_reachable(p) for p in site.getsitepackages())]
    exe = _reachable(sys.executable)
    if _world_executable(exe):
        return exe, os.pathsep.join(paths)
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for cand in (f"/usr/bin/{ver}", f"/usr/local/bin/{ver}"):
        if os.path.exists(cand) and _world_executable(cand):
            return cand, os.pathsep.join(paths)
    pytest.skip(f"no {ver} that unprivileged users can execute")


@dataclass(frozen=True)
class RealUser:
    name: str
    uid: int
    gid: int
    home: Path

    @property
    def tenant(self) -> str:
        return f"u{self.uid}"

    def env(self, **extra: str) -> dict[str, str]:
        py, pypath = user_python()
        env = {"PATH": f"{Path(py).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home),
               "USER": self.name, "LOGNAME": self.name, "PYTHONPATH": pypath,
               "LANG": "C.UTF-8"}
        if os.environ.get("CASFS_LOG_TAP"):  # their casfs warnings count too (logcheck)
            env["CASFS_LOG_TAP"] = os.environ["CASFS_LOG_TAP"]
        env.update(extra)
        return env

    def argv(self, args: Sequence[str]) -> list[str]:
        """``args`` run as this user (her uid, gid and groups)."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups",
                "--", *args]

    def run(self, args: Sequence[str], *, env: dict[str, str] | None = None,
            timeout: float = 120, check: bool = False, cwd: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(args), env=env or self.env(), capture_output=True,
                              text=True, timeout=timeout, check=check,
                              cwd=cwd or str(self.home))

    def popen(self, args: Sequence[str], *, env: dict[str, str] | None = None,
              **kw: Any) -> subprocess.Popen[str]:
        """``args`` started as this user in her home, in the background: stdout and
        stderr piped, text (``kw`` passes on, e.g. ``start_new_session``)."""
        opts: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        opts.update(kw)
        return subprocess.Popen(self.argv(args), env=env or self.env(), text=True,
                                cwd=str(self.home), **opts)

    def sh(self, script: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return self.run(["/bin/sh", "-c", script], **kw)  # type: ignore[arg-type]

    def python(self, code: str, *, env: dict[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
        py, _ = user_python()
        return self.run([py, "-c", code], env=env, timeout=timeout)

    def casfs(self, *args: str, env: dict[str, str] | None = None,
              timeout: float = 180) -> subprocess.CompletedProcess[str]:
        py, _ = user_python()
        return self.run([py, "-m", "casfs.cli.main", *args], env=env, timeout=timeout)


def _need_root() -> None:
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv")


@contextlib.contextmanager
def real_users(count: int, tmp: Path, *, group: str | None = None,
               in_group: Sequence[int] = ()) -> Iterator[list[RealUser]]:
    """``count`` fresh users with homes under ``tmp``; users ``in_group`` join ``group``."""
    _need_root()
    tag = f"cf{os.getpid() % 100000}{os.urandom(2).hex()}"
    made: list[str] = []
    gname = f"{tag}g" if group is None else group
    made_group = False
    try:
        if in_group:
            subprocess.run(["groupadd", gname], check=True, capture_output=True)
            made_group = True
        users = []
        for i in range(count):
            name = f"{tag}u{i}"
            home = tmp / f"home-{name}"
            home.mkdir(mode=0o700)
            cmd = ["useradd", "-M", "-N", "-d", str(home), "-s", "/bin/sh", name]
            if i in in_group:
                cmd[1:1] = ["-G", gname]
            subprocess.run(cmd, check=True, capture_output=True)
            made.append(name)
            import pwd

            pw = pwd.getpwnam(name)
            os.chown(home, pw.pw_uid, pw.pw_gid)
            users.append(RealUser(name, pw.pw_uid, pw.pw_gid, home))
        yield users
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
        if made_group:
            subprocess.run(["groupdel", gname], capture_output=True)


def group_gid(users: list[RealUser]) -> int:
    """The gid of the group real_users made (its name is the users' tag + 'g')."""
    import grp

    return grp.getgrnam(users[0].name.rsplit("u", 1)[0] + "g").gr_gid


@contextlib.contextmanager
def open_tmp() -> Iterator[Path]:
    """A scratch directory every user can traverse (pytest's tmp_path is root's 0700)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="casfs-tenants-"))
    try:
        os.chmod(d, 0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
