"""Real unix users for tenant tests: created with useradd, removed in finally.

Commands run as a user through ``setpriv`` (real uid, gid and supplementary
groups, like a job started by Slurm or a login shell). The interpreter must be
one the user can execute: the venv's own if its path is open to everyone,
otherwise the system python of the same minor version with the venv's
site-packages on PYTHONPATH (a pyenv under /root is not reachable by users).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

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


def user_python() -> tuple[str, str]:
    """(interpreter, PYTHONPATH) that any user can run casfs with."""
    paths = [str(REPO), *site.getsitepackages()]
    if _world_executable(sys.executable):
        return sys.executable, os.pathsep.join(paths)
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
        env.update(extra)
        return env

    def run(self, args: Sequence[str], *, env: dict[str, str] | None = None,
            timeout: float = 120, check: bool = False, cwd: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups",
               "--", *args]
        return subprocess.run(cmd, env=env or self.env(), capture_output=True, text=True,
                              timeout=timeout, check=check, cwd=cwd or str(self.home))

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
