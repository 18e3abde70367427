"""The one serving model: one FUSE session per node, a directory per (tenant, namespace).

Real mounts, real CLI, real concurrent jobs: two ``casfs run`` of one
namespace at once (the second shares, the last out publishes), namespaces
attached and released at run time without remounting, leases held by a
job's process and by any process that still maps a file there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fusehelpers import mounted

from casfs.errors import NotFoundError
from casfs.node import control
from casfs.node.guard import mounts_at
from casfs.node.host import HostConfig, spawn_host
from casfs.store.root import SharedRoot

pytestmark = [pytest.mark.fuse]

UID = f"u{os.geteuid()}"  # casfs.tenants: the default tenant of a uid


def wait_for(pred: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def published(root: Path, ns: str) -> dict[str, bytes]:
    r = SharedRoot.open(root)
    try:
        entries = r.generations().entries(ns).entries
    except NotFoundError:  # not published (yet)
        return {}
    return {p: r.objects.get_bytes(e.digest) for p, e in entries.items()}


def host_cfg(node: dict[str, Any], **kw: Any) -> HostConfig:
    opts: dict[str, Any] = {"stable_after": 0.2, "publish_interval": 3600.0,
                            "refresh_interval": 3600.0, "grace": 0.0, "lease_poll": 0.1,
                            "exit_when_idle": True}
    opts.update(kw)
    return HostConfig(base=node["base"], root=node["root"], state_dir=node["state"], **opts)


def casfs(node: dict[str, Any], *args: str, **kw: Any) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-m", "casfs.cli.main", *args], env=node["env"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    node["procs"].append(p)
    return p


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def test_two_casfs_run_at_once_share_one_mount(node: dict[str, Any]) -> None:
    """The second job shares the first's mount; the last one out publishes and unmounts."""
    flag = node["tmp"] / "second-done"
    first = casfs(node, "run", "--family", "generic", "-n", "shared", "--stable-after", "0.2",
                  "--", sys.executable, "-c",
                  "import os, time, pathlib\n"
                  "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                  "(d / 'first').write_text('one')\n"
                  f"while not os.path.exists({str(flag)!r}): time.sleep(0.05)\n"
                  "print(sorted(os.listdir(d)), d)\n")
    path = node["base"] / UID / "shared"
    wait_for(lambda: mounted(node["base"]) and (path / "first").exists(), "the first job's file")
    second = casfs(node, "run", "--family", "generic", "-n", "shared", "--stable-after", "0.2",
                   "--", sys.executable, "-c",
                   "import os, pathlib\n"
                   "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                   "assert (d / 'first').read_text() == 'one'\n"
                   "(d / 'second').write_text('two')\n"
                   f"open({str(flag)!r}, 'w').close()\n")
    _, err2 = second.communicate(timeout=120)
    assert second.returncode == 0, err2.decode()
    assert b"still used by another job" in err2  # the second job did not unmount
    out1, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1.decode()
    assert out1.decode().split("]")[0] == "['first', 'second'"
    assert str(path) in out1.decode()  # both jobs saw the same directory
    assert published(node["root"], "shared") == {"first": b"one", "second": b"two"}
    wait_for(lambda: not mounted(node["base"]), "the last job's unmount")
    assert not mounts_at(node["base"])  # the read-only guard went with it


def test_namespaces_share_one_session_and_come_and_go(node: dict[str, Any]) -> None:
    w = spawn_host(host_cfg(node))
    sock = w.cfg.socket_path
    try:
        job = sleeper()
        r = control.request(sock, "lease", pid=job.pid,
                            caches=[{"family": "generic", "namespace": "alpha"},
                                    {"family": "triton", "namespace": "beta"}])
        assert r["ok"], r
        a, b = (Path(c["path"]) for c in r["caches"])
        assert (a, b) == (node["base"] / UID / "alpha", node["base"] / UID / "beta")
        (a / "d").mkdir()
        (a / "d" / "f").write_text("in alpha")
        (b / "f").write_text("in beta")
        sa, sb = os.stat(a / "d" / "f"), os.stat(b / "f")
        assert sa.st_dev == sb.st_dev  # one FUSE session
        inodes = {os.stat(p).st_ino for p in (a, b, a / "d", a / "d" / "f", b / "f")}
        assert len(inodes) == 5  # unique across namespaces
        assert sorted(os.listdir(node["base"] / UID)) == ["alpha", "beta"]
        os.rename(a / "d" / "f", a / "g")
        with pytest.raises(OSError) as e:
            os.rename(a / "g", b / "g")
        assert e.value.errno == 18  # EXDEV: namespaces are separate trees
        mnt_before = [m for m in mounts_at(node["base"]) if m.fstype.startswith("fuse")]

        # A second job takes gamma while alpha stays open; its release leaves alpha alone.
        held = open(a / "g")  # noqa: SIM115
        job2 = sleeper()
        r2 = control.request(sock, "lease", pid=job2.pid,
                             caches=[{"family": "generic", "namespace": "gamma"}])
        (Path(r2["caches"][0]["path"]) / "x").write_text("gamma")
        job2.kill()
        job2.wait()
        wait_for(lambda: published(node["root"], "gamma"), "gamma's final publication")
        assert published(node["root"], "gamma") == {"x": b"gamma"}
        assert "gamma" not in os.listdir(node["base"] / UID)  # released
        assert held.read() == "in alpha"  # an open file across another namespace's detach
        held.close()
        assert [m for m in mounts_at(node["base"]) if m.fstype.startswith("fuse")] == mnt_before

        job.kill()
        job.wait()
        wait_for(lambda: w.proc.poll() is not None, "the host to exit once idle")
        assert published(node["root"], "alpha") == {"g": b"in alpha"}
        assert published(node["root"], "beta") == {"f": b"in beta"}
    finally:
        w.stop()


def test_a_mapped_library_keeps_the_namespace(node: dict[str, Any]) -> None:
    """The job is gone but a process still maps a .so from its cache: no release."""
    w = spawn_host(host_cfg(node))
    try:
        job = sleeper()
        r = control.request(w.cfg.socket_path, "lease", pid=job.pid,
                            caches=[{"family": "generic", "namespace": "libs"}])
        lib = Path(r["caches"][0]["path"]) / "k.so"
        lib.write_bytes(b"\x7fELF" + b"\0" * 8192)
        mapper = subprocess.Popen(
            [sys.executable, "-c",
             "import mmap, sys, time\n"
             f"f = open({str(lib)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
             "f.close(); print('mapped', flush=True); time.sleep(600)"],
            stdout=subprocess.PIPE)
        assert mapper.stdout is not None and mapper.stdout.readline() == b"mapped\n"
        job.kill()
        job.wait()

        def holders() -> list[int]:
            st = control.request(w.cfg.socket_path, "status")
            return [p for ns in st["namespaces"] for p in ns["users"]]

        # The lease is gone; the mapping alone now holds the namespace.
        assert wait_for(lambda: holders() == [mapper.pid], "the mapping to hold the namespace")
        assert (node["base"] / UID / "libs").is_dir()
        mapper.send_signal(signal.SIGKILL)
        mapper.wait()
        wait_for(lambda: w.proc.poll() is not None, "release once the mapping is gone")
        assert published(node["root"], "libs")["k.so"].startswith(b"\x7fELF")
    finally:
        w.stop()


def test_stacking_a_mount_on_a_served_path_is_refused(node: dict[str, Any]) -> None:
    w = spawn_host(host_cfg(node, exit_when_idle=False))
    try:
        p = casfs(node, "mount", str(node["base"]), "--family", "generic", "-n", "other")
        _, err = p.communicate(timeout=120)
        assert p.returncode != 0
        assert b"already mounted" in err and b"refusing" in err
        st = control.request(w.cfg.socket_path, "status")
        assert st["ok"] and w.proc.poll() is None  # the served mount is untouched
        assert len([m for m in mounts_at(node["base"]) if m.fstype.startswith("fuse")]) == 1
        # Unmounting one namespace directory is refused too: jobs hold it, not the CLI.
        p = casfs(node, "umount", str(node["base"] / UID / "some-ns"))
        _, err = p.communicate(timeout=120)
        assert p.returncode != 0 and b"released when its last job is gone" in err
        assert w.proc.poll() is None
    finally:
        w.stop()


def test_without_fuse_casfs_run_falls_back_to_dir_mode(node: dict[str, Any]) -> None:
    """/dev/fuse hidden (a private /dev in a mount namespace): the job still runs, cached."""
    script = ("import os; d = os.environ['CASFS_CACHE_DIR']; print(d);"
              " open(d + '/hello', 'w').write('hi')")
    inner = (f"mount -t tmpfs devtmp /dev && mknod -m 666 /dev/null c 1 3 && "
             f"exec {sys.executable} -m casfs.cli.main run --family generic -n nofuse"
             f" --stable-after 0.2 -- {sys.executable} -c \"{script}\"")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
                       env=node["env"], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert "dir mode" in r.stderr and "1 published" in r.stderr
    assert r.stdout.strip() == str(node["base"] / UID / "nofuse")
    assert published(node["root"], "nofuse") == {"hello": b"hi"}


def test_nothing_servable_runs_the_job_with_a_private_dir(node: dict[str, Any]) -> None:
    bad_state = node["tmp"] / "not-a-dir"
    bad_state.write_text("")
    env = dict(node["env"], CASFS_STATE_DIR=str(bad_state))
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        "-n", "x", "--", sys.executable, "-c",
                        "import os; d = os.environ['CASFS_CACHE_DIR'];"
                        " open(d + '/f', 'w').write('x'); print(d)"],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "private and temporary" in warnings[0]
    assert "casfs-private-" in r.stdout and not Path(r.stdout.strip()).exists()  # cleaned up
