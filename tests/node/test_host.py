"""The one serving model: one FUSE session per node, a directory per (tenant, namespace).

Real mounts, real CLI, real concurrent jobs: two ``casfs run`` of one
namespace at once (the second shares, the last out publishes), namespaces
attached and released at run time without remounting, leases held by a
job's process and by any process that still maps a file there.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fusehelpers import mounted
from waiting import wait_until

from casfs.errors import NotFoundError
from casfs.node import control
from casfs.node.guard import mounts_at
from casfs.node.host import HostConfig, spawn_host
from casfs.store.root import SharedRoot

pytestmark = [pytest.mark.fuse]

UID = f"u{os.geteuid()}"  # casfs.tenants: the default tenant of a uid


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
                            "exit_when_idle": True, "shutdown_timeout": 120.0}
    opts.update(kw)
    return HostConfig(base=node["base"], root=node["root"], state_dir=node["state"], **opts)


def casfs(node: dict[str, Any], *args: str, **kw: Any) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-m", "casfs.cli.main", *args], env=node["env"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    node["procs"].append(p)
    return p


def sleeper() -> subprocess.Popen[bytes]:
    """A job's process, to hold a lease: ``end`` ends it as a job ends (exit 0). Killed,
    it is a killed job: what its namespaces changed just before is not published."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)


def end(job: subprocess.Popen[bytes]) -> None:
    """The job ends cleanly (its input closed, it exits 0)."""
    assert job.stdin is not None
    job.stdin.close()
    assert job.wait(timeout=60) == 0


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
    wait_until(lambda: mounted(node["base"]) and (path / "first").exists(), "the first job's file")
    second = casfs(node, "run", "--family", "generic", "-n", "shared", "--stable-after", "0.2",
                   "--", sys.executable, "-c",
                   "import os, pathlib\n"
                   "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                   "assert (d / 'first').read_text() == 'one'\n"
                   "(d / 'second').write_text('two')\n")
    _, err2 = second.communicate(timeout=120)
    assert second.returncode == 0, err2.decode()
    assert b"still used by another job" in err2  # the second job did not unmount
    flag.touch()  # only now may the first job end: it is the last one out
    out1, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1.decode()
    assert out1.decode().split("]")[0] == "['first', 'second'"
    assert str(path) in out1.decode()  # both jobs saw the same directory
    assert published(node["root"], "shared") == {"first": b"one", "second": b"two"}
    wait_until(lambda: not mounted(node["base"]), "the last job's unmount")
    assert not mounts_at(node["base"])  # the read-only guard went with it


def test_namespaces_share_one_session_and_come_and_go(node: dict[str, Any]) -> None:
    w = spawn_host(host_cfg(node), log_to_stderr=True)
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
        end(job2)
        wait_until(lambda: published(node["root"], "gamma"), "gamma's final publication")
        assert published(node["root"], "gamma") == {"x": b"gamma"}
        assert "gamma" not in os.listdir(node["base"] / UID)  # released
        assert held.read() == "in alpha"  # an open file across another namespace's detach
        held.close()
        assert [m for m in mounts_at(node["base"]) if m.fstype.startswith("fuse")] == mnt_before

        end(job)
        wait_until(lambda: w.proc.poll() is not None, "the host to exit once idle")
        assert published(node["root"], "alpha") == {"g": b"in alpha"}
        assert published(node["root"], "beta") == {"f": b"in beta"}
    finally:
        w.stop()


def test_a_lease_during_its_namespaces_release_waits_for_it(node: dict[str, Any]) -> None:
    """A job's lease arrives while the last one's release still publishes the namespace:
    it waits for that release, then is served what it published (it was refused:
    "already mounted", the release holding the namespace's lock)."""
    w = spawn_host(host_cfg(node, stable_after=3600.0), log_to_stderr=True)
    sock = w.cfg.socket_path
    keeper = sleeper()  # another namespace's job: the host stays up whatever the timing
    try:
        assert control.request(sock, "lease", pid=keeper.pid,
                               caches=[{"family": "generic", "namespace": "beta"}])["ok"]
        job = sleeper()
        r = control.request(sock, "lease", pid=job.pid,
                            caches=[{"family": "generic", "namespace": "alpha"}])
        path = Path(r["caches"][0]["path"])
        files = {f"f{i}": os.urandom(1500) for i in range(300)}  # a release that takes a while
        for name, data in files.items():
            (path / name).write_bytes(data)
        end(job)
        wait_until(lambda: "alpha" not in os.listdir(node["base"] / UID), "alpha's release",
                   interval=0.005)
        job2 = sleeper()
        r2 = control.request(sock, "lease", pid=job2.pid,
                             caches=[{"family": "generic", "namespace": "alpha"}])
        assert r2["ok"], r2
        assert r2["caches"][0]["served_seq"] == 1  # the release's publication
        assert (path / "f7").read_bytes() == files["f7"]
        end(job2)
        end(keeper)
        wait_until(lambda: w.proc.poll() is not None, "the host to exit once idle")
        assert published(node["root"], "alpha") == files
    finally:
        keeper.kill()
        w.stop()


def test_a_mapped_library_keeps_the_namespace(node: dict[str, Any]) -> None:
    """The job is gone but a process still maps a .so from its cache: no release."""
    w = spawn_host(host_cfg(node), log_to_stderr=True)
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
        end(job)

        def holders() -> list[int]:
            st = control.request(w.cfg.socket_path, "status")
            return [p for ns in st["namespaces"] for p in ns["users"]]

        # The lease is gone; the mapping alone now holds the namespace.
        assert wait_until(lambda: holders() == [mapper.pid], "the mapping to hold the namespace")
        assert (node["base"] / UID / "libs").is_dir()
        mapper.send_signal(signal.SIGKILL)
        mapper.wait()
        wait_until(lambda: w.proc.poll() is not None, "release once the mapping is gone")
        assert published(node["root"], "libs")["k.so"].startswith(b"\x7fELF")
    finally:
        w.stop()


@pytest.mark.expect_log(
    r"is already mounted \(casfs-ns\); refusing to mount namespace other on top of it",
)
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


def test_two_casfs_mount_of_one_family_each_umount_publishes(node: dict[str, Any]) -> None:
    """Two ``casfs mount`` of one family at two paths (no --name): each is its own mount,
    found by ``casfs status`` and ``casfs umount``, which publishes it. Both used to be
    named after the family: the second shadowed the first's socket and registry, and
    ``casfs umount`` of either said "no casfs process was serving it" and published
    nothing."""
    m1, m2 = node["tmp"] / "m1", node["tmp"] / "m2"
    for m, ns in ((m1, "fa"), (m2, "fb")):
        p = casfs(node, "mount", str(m), "--family", "generic", "-n", ns,
                  "--stable-after", "0.2")
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    try:
        (m1 / "f1").write_text("one")
        (m2 / "f2").write_text("two")
        st = casfs(node, "status", "--json")
        out, _ = st.communicate(timeout=60)
        assert {m["mountpoint"] for m in json.loads(out)} >= {str(m1), str(m2)}
        for m in (m1, m2):
            p = casfs(node, "umount", str(m))
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0 and b"no casfs process" not in out, (out, err)
        assert published(node["root"], "fa") == {"f1": b"one"}
        assert published(node["root"], "fb") == {"f2": b"two"}
    finally:
        for m in (m1, m2):
            subprocess.run(["fusermount3", "-u", "-z", str(m)], capture_output=True, check=False)


@pytest.mark.expect_log(
    r"shared root unavailable, serving local state only: cannot reach the shared root",
)
def test_an_unreachable_root_is_not_tried_again_at_release(node: dict[str, Any]) -> None:
    """I4 for `casfs run`'s exit: a root that just failed to open (each try may take
    fetch_timeout) is not tried again by each of the release's promotion and
    publication: with a stalled S3 server that held `casfs run` 2 x 10 s after its job
    had ended. The final publication tries it once more, within the short open bound
    (a root that was only slow to open must not cost the job its files: see
    tests/faults/test_root_late.py). The job runs, its file stays in the node's upper
    for a later publication."""
    env = dict(node["env"], CASFS_ROOT="s3://casfs-none/x?endpoint=http://127.0.0.1:1",
               AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s", AWS_REGION="us-east-1")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "casfs.cli.main", "run", "--family", "generic",
                        "-n", "down", "--", "/bin/sh", "-c", 'echo x > "$CASFS_CACHE_DIR/x"'],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 30, r.stderr  # not held 2 x fetch_timeout per try
    log = (node["state"] / "log" / "host.log").read_text()
    assert log.count("shared root unavailable") == 2, log  # at start, once at release
    assert (node["state"] / "upper").exists()


def test_two_casfs_run_in_dir_mode_share_the_directory(node: dict[str, Any]) -> None:
    """Issue 8 item 5 without FUSE (dir mode: a user without /dev/fuse falls back to it):
    a second job of the namespace shares the first's plain directory instead of getting
    a private temporary one, and what both wrote is published when the first ends."""
    flag = node["tmp"] / "second-done"
    first = casfs(node, "run", "--mode", "dir", "--family", "generic", "-n", "dshared",
                  "--stable-after", "0.2", "--", sys.executable, "-c",
                  "import os, time, pathlib\n"
                  "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                  "(d / 'first').write_text('one')\n"
                  f"while not os.path.exists({str(flag)!r}): time.sleep(0.05)\n")
    path = node["base"] / UID / "dshared"
    wait_until(lambda: (path / "first").exists(), "the first job's file")
    second = casfs(node, "run", "--mode", "dir", "--family", "generic", "-n", "dshared",
                   "--stable-after", "0.2", "--", sys.executable, "-c",
                   "import os, pathlib\n"
                   "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                   "assert (d / 'first').read_text() == 'one', d\n"
                   "(d / 'second').write_text('two')\n")
    _, err2 = second.communicate(timeout=120)
    assert second.returncode == 0, err2.decode()
    assert b"private and temporary" not in err2 and b"sharing" in err2, err2.decode()
    flag.write_text("")
    _, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1.decode()
    assert published(node["root"], "dshared") == {"first": b"one", "second": b"two"}


def test_dir_mode_last_job_out_publishes_the_late_files(node: dict[str, Any]) -> None:
    """Dir mode follows the rule of leases: the last job out publishes. Two overlapping
    `casfs run --mode dir` jobs of one namespace; the first (which spawned the dir-mode
    process) ends first, the second writes more files after that, then ends: those late
    files are watched, promoted and published by the second's exit, and a second node
    (fresh state dir, same root) restores them."""
    f1, f2 = node["tmp"] / "end-first", node["tmp"] / "end-second"
    opts = ("run", "--mode", "dir", "--family", "generic", "-n", "dlast", "--stable-after",
            "0.2", "--")
    first = casfs(node, *opts, sys.executable, "-c",
                  "import os, time, pathlib\n"
                  "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                  "(d / 'first').write_text('one')\n"
                  f"while not os.path.exists({str(f1)!r}): time.sleep(0.05)\n")
    path = node["base"] / UID / "dlast"
    try:
        wait_until(lambda: (path / "first").exists(), "the first job's file")
        second = casfs(node, *opts, sys.executable, "-c",
                       "import os, time, pathlib\n"
                       "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                       "(d / 'early').write_text('two')\n"
                       f"while not os.path.exists({str(f2)!r}): time.sleep(0.05)\n"
                       "(d / 'late').write_text('three')\n"
                       "(d / 'sub').mkdir()\n"
                       "(d / 'sub' / 'late2').write_bytes(b'four' * 5000)\n")
        wait_until(lambda: (path / "early").exists(), "the second job's first file")
        f1.write_text("")
        _, err1 = first.communicate(timeout=120)
        assert first.returncode == 0, err1.decode()
        assert b"still used by another job" in err1, err1.decode()
        f2.write_text("")
        _, err2 = second.communicate(timeout=120)
        assert second.returncode == 0, err2.decode()
        assert b"sharing" in err2 and b"published" in err2, err2.decode()
        want = {"first": b"one", "early": b"two", "late": b"three",
                "sub/late2": b"four" * 5000}
        assert published(node["root"], "dlast") == want
        # nothing left serving the directory: the last job stopped the process
        assert control.registered(node["state"] / "run") == []
        env_b = dict(node["env"], CASFS_STATE_DIR=str(node["tmp"] / "state-b"),
                     CASFS_MOUNT_BASE=str(node["tmp"] / "mnt-b"))
        check = subprocess.run(
            [sys.executable, "-m", "casfs.cli.main", *opts, sys.executable, "-c",
             "import os, pathlib\n"
             "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
             "assert (d / 'late').read_text() == 'three'\n"
             "assert (d / 'sub' / 'late2').read_bytes() == b'four' * 5000\n"],
            env=env_b, capture_output=True, timeout=120, check=False)
        assert check.returncode == 0, check.stderr.decode()
    finally:
        for m in control.registered(node["state"] / "run"):  # a failed run's orphan
            os.kill(int(m["pid"]), signal.SIGKILL)


def test_dir_mode_a_killed_first_job_counts_out(node: dict[str, Any]) -> None:
    """The `casfs run` that spawned the dir-mode process is killed outright (SIGKILL: no
    exit path runs); its flock goes with it, so the other job, ending later, is the last
    one out: it stops the orphaned process, which publishes both jobs' files."""
    f2 = node["tmp"] / "end-second"
    opts = ("run", "--mode", "dir", "--family", "generic", "-n", "dkill", "--stable-after",
            "0.2", "--")
    first = casfs(node, *opts, sys.executable, "-c",
                  "import os, time, pathlib\n"
                  "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                  "(d / 'first').write_text('one')\n"
                  "time.sleep(600)\n", start_new_session=True)
    path = node["base"] / UID / "dkill"
    try:
        wait_until(lambda: (path / "first").exists(), "the first job's file")
        second = casfs(node, *opts, sys.executable, "-c",
                       "import os, time, pathlib\n"
                       "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                       "(d / 'early').write_text('')\n"
                       f"while not os.path.exists({str(f2)!r}): time.sleep(0.05)\n"
                       "(d / 'late').write_text('two')\n")
        # its job runs: it has joined
        wait_until(lambda: (path / "early").exists(), "the second job's first file")
        os.killpg(first.pid, signal.SIGKILL)  # casfs run and its job: no exit path runs
        first.wait(30)
        assert control.registered(node["state"] / "run") != []  # the process lives on
        f2.write_text("")
        _, err2 = second.communicate(timeout=120)
        assert second.returncode == 0, err2.decode()
        assert b"published" in err2, err2.decode()
        assert published(node["root"], "dkill") == {"first": b"one", "early": b"",
                                                     "late": b"two"}
        assert control.registered(node["state"] / "run") == []
    finally:
        for m in control.registered(node["state"] / "run"):
            os.kill(int(m["pid"]), signal.SIGKILL)


@pytest.mark.parametrize("job_marker", [True, False], ids=["job-marker", "entry-only"])
def test_dir_mode_a_job_never_joins_a_process_that_is_stopping(node: dict[str, Any],
                                                               job_marker: bool) -> None:
    """The last job out is stopping the dir-mode process, whose final publication is held
    (pausepoint ``dir-final-publication``), and that job's `casfs run` is killed there
    (a scheduler's kill): the join lock goes with it while the process is still
    registered. A job starting in that window must not join the process about to exit
    (its files, written after the final scan, would never be published): it waits for
    the exit, spawns a fresh process, and its file reaches a second node. Both marks are
    checked: the stopping job's (``dirshare-*.stopping``, written before it signals) and
    the process's own (its registry entry's ``stopping``, written when its shutdown
    starts, whoever stopped it): ``entry-only`` removes the job's."""
    run = node["state"] / "run"
    pause, go, started = (node["tmp"] / n for n in ("pause", "go", "started"))
    opts = ("run", "--mode", "dir", "--family", "generic", "-n", "dstop", "--stable-after",
            "0.2", "--")
    cli = [sys.executable, "-m", "casfs.cli.main", *opts, sys.executable, "-c"]
    env1 = dict(node["env"], CASFS_PAUSEPOINT="dir-final-publication",
                CASFS_PAUSEPOINT_FILE=str(pause), CASFS_PAUSEPOINT_MAX="120")
    first = subprocess.Popen(
        [*cli, "import os, pathlib\n"
               "(pathlib.Path(os.environ['CASFS_CACHE_DIR']) / 'first').write_text('one')\n"],
        env=env1, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    node["procs"].append(first)
    err2 = node["tmp"] / "second.err"
    old = -1
    try:
        wait_until(lambda: Path(f"{pause}.reached").exists(), "the final publication held",
                   timeout=120)
        old = os.pidfd_open(int(json.loads((run / "generic.json").read_bytes())["pid"]))
        os.killpg(first.pid, signal.SIGKILL)  # casfs run, stopping it: no exit path runs
        first.wait(30)
        if not job_marker:
            for p in run.glob("dirshare-*.stopping"):
                p.unlink()
        with err2.open("wb") as f:
            second = subprocess.Popen(
                [*cli, "import os, time, pathlib\n"
                       f"pathlib.Path({str(started)!r}).write_text('')\n"
                       f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
                       "(pathlib.Path(os.environ['CASFS_CACHE_DIR']) / 'second')"
                       ".write_text('two')\n"],
                env=node["env"], stdout=subprocess.DEVNULL, stderr=f)
        node["procs"].append(second)
        # the second job is in the window: waiting for the exit, or (joined) running
        wait_until(lambda: started.exists() or b"is stopping" in err2.read_bytes(),
                   "the second job joining", timeout=120)
        pause.write_text("")  # the final publication goes on; the process exits
        assert select.select([old], [], [], 120)[0], "the stopping process did not exit"
        go.write_text("")
        assert second.wait(120) == 0, err2.read_text()
        assert published(node["root"], "dstop") == {"first": b"one", "second": b"two"}
        assert b"is stopping; waiting" in err2.read_bytes(), err2.read_text()
        assert control.registered(run) == []  # nothing left behind
        env_b = dict(node["env"], CASFS_STATE_DIR=str(node["tmp"] / "state-b"),
                     CASFS_MOUNT_BASE=str(node["tmp"] / "mnt-b"))
        check = subprocess.run(
            [*cli, "import os, pathlib\n"
                   "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                   "assert (d / 'second').read_text() == 'two'\n"
                   "assert (d / 'first').read_text() == 'one'\n"],
            env=env_b, capture_output=True, timeout=120, check=False)
        assert check.returncode == 0, check.stderr.decode()
        assert control.registered(node["tmp"] / "state-b" / "run") == []
    finally:
        pause.write_text("")
        go.write_text("")
        if old >= 0:
            os.close(old)
        for m in control.registered(run):
            os.kill(int(m["pid"]), signal.SIGKILL)


def test_dir_mode_a_stale_entry_whose_pid_was_reused_is_not_the_process(
        node: dict[str, Any]) -> None:
    """The dir-mode process died outright (its registry entry stays) and its pid now
    belongs to another casfs worker (here: a `casfs mount --mode dir` of another
    namespace). The next job of the namespace must not take that process for its own:
    it spawns a dir-mode process (so its files are published), and its exit never
    signals the other mount."""
    from casfs.node.dirshare import DirShare

    run = node["state"] / "run"
    path = node["base"] / UID / "dreuse"
    saved = node["tmp"] / "entry.json"
    opts = ("run", "--mode", "dir", "--family", "generic", "-n", "dreuse", "--stable-after",
            "0.2", "--")
    first = casfs(node, *opts, sys.executable, "-c",
                  "import os, pathlib, shutil\n"
                  "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                  "(d / 'first').write_text('one')\n"
                  f"shutil.copy({str(run / 'generic.json')!r}, {str(saved)!r})\n")
    _, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1.decode()
    other = casfs(node, "mount", "--mode", "dir", "--family", "generic", "-n", "elsewhere",
                  "--name", "elsewhere", str(node["tmp"] / "elsewhere"))
    _, err = other.communicate(timeout=120)
    assert other.returncode == 0, err.decode()
    try:
        q = int(json.loads((run / "elsewhere.json").read_bytes())["pid"])
        # the dead process's entry, its pid reused by the other mount
        entry = json.loads(saved.read_bytes())
        assert entry["mountpoint"] == str(path)
        (run / "generic.json").write_text(json.dumps(dict(entry, pid=q)))
        DirShare(run, path).spawned(q)
        second = casfs(node, *opts, sys.executable, "-c",
                       "import os, pathlib\n"
                       "d = pathlib.Path(os.environ['CASFS_CACHE_DIR'])\n"
                       "(d / 'second').write_text('two')\n")
        _, err2 = second.communicate(timeout=120)
        assert second.returncode == 0, err2.decode()
        assert b"sharing" not in err2, err2.decode()
        assert published(node["root"], "dreuse") == {"first": b"one", "second": b"two"}
        os.kill(q, 0)  # the other mount still runs
        assert any(m["name"] == "elsewhere" for m in control.registered(run))
    finally:
        for m in control.registered(run):
            if m["name"] != "generic":
                os.kill(int(m["pid"]), signal.SIGKILL)
