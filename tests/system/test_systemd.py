"""casfsd under a real systemd (issue 24): the shipped unit, installed by daemon/install.sh
from the wheel built from this checkout, in a container whose PID 1 is systemd.

The container: a Debian minbase tree of this machine's release with systemd, dbus,
python3 and fuse3 (scripts/systemd-tree.sh, cached under $CASFS_CI_CACHE), booted
read-only under a throwaway overlay with ``systemd-nspawn --boot``, once for the
module. /dev/fuse is bound in; the shared root is a host directory bound at /shared;
its own network (loopback only). The host needs no systemd: nspawn runs with
--register=no --keep-unit, and commands enter the container with ``nsenter -t
<its PID 1> -a``. Tests run in order, on the same casfsd:

- ``systemctl start`` returns once casfsd sent READY=1 (Type=notify: activating
  until then, and the mount serves when it returns); ``systemctl status`` shows
  casfsd's STATUS= line;
- a job under casfs env (casfsd's jobs socket) and one writing to a static mount whose
  publish_interval is an hour: ``systemctl stop`` publishes both;
- ``systemctl reload`` applies an added mount and a log level, the unchanged mount
  keeps its worker; a bad file is refused in one ERROR line, casfsd serves on;
- ``systemctl restart`` and ``kill -9`` of casfsd under a running job (held fds, an
  mmap, its cwd in the mount): the new casfsd adopts the mount processes, the job sees
  nothing (casfs.node.lifeline); between them a ``systemctl reload`` that changes the
  job's mount hands it over to a new mount process (casfs.node.handover), unseen too;
- ``kill -9`` of casfsd: systemd restarts it (Restart=on-failure), and it serves;
- ``journalctl -u casfsd -o json``: casfs's lines with PRIORITY of their levels;
- the watchdog: pings arrive; a casfsd stopped with SIGSTOP is aborted and restarted.

A machine that cannot do this (not root, no systemd-nspawn, no /dev/fuse, no
debootstrap and no cached tree) fails here, naming what is missing: never a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The tests share one booted container (``box``, module scope) and run in order: make
# test's --dist loadscope keeps them on one worker with no other module's test between.
pytestmark = [pytest.mark.slow, pytest.mark.fuse]

REPO = Path(__file__).resolve().parents[2]
TREE_SCRIPT = REPO / "scripts" / "systemd-tree.sh"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEADLINE = 120.0

CONFIG = """\
[store]
root = "/shared/casfs"
[node]
state_dir = "/var/lib/casfs"
mount_base = "/run/casfs"
[log]
level = "{level}"
[metrics]
listen = "127.0.0.1:9464"
[defaults]
stable_after = 0.5
publish_interval = 3600.0   # only the final publication (systemctl stop) publishes
refresh_interval = 5.0
[[mounts]]
name = "kern"
family = "generic"
namespace = "kern-ns"
path = "/run/casfs/kern"
{extra}"""

EXTRA_MOUNT = """\
[[mounts]]
name = "extra"
family = "generic"
namespace = "extra-ns"
path = "/run/casfs/extra"
"""

TIMINGS: dict[str, float] = {}


def _missing() -> str | None:
    """Why this machine cannot boot the container, or None."""
    if os.geteuid() != 0:
        return "needs root (overlay mount, systemd-nspawn)"
    for tool, pkg in (("systemd-nspawn", "systemd-container"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install {pkg}; scripts/bootstrap.sh does)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    return None


class Container:
    """A booted systemd-nspawn container over an overlay of the cached tree."""

    def __init__(self, work: Path, tree: Path, wheelhouse: Path) -> None:
        self.work = work
        self.merged = work / "root"
        self.shared = work / "shared"
        for d in ("upper", "ovl", "root", "shared"):
            (work / d).mkdir()
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={tree},upperdir={work / 'upper'},workdir={work / 'ovl'}",
                        str(self.merged)], check=True, capture_output=True, text=True)
        self.name = f"casfs-ci-{secrets.token_hex(3)}"
        self.console = open(work / "console.log", "wb")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "--quiet", "-D", str(self.merged), "--boot",
             "--register=no", "--keep-unit", f"--machine={self.name}",
             "--private-network", "--console=read-only", "--bind=/dev/fuse",
             # nspawn's own syscall filter (systemd 252) refuses it: casfsd holds its
             # mount processes' FUSE connections with it (a host has no such filter)
             "--system-call-filter=pidfd_getfd",
             f"--bind={self.shared}:/shared", f"--bind-ro={wheelhouse}:/wh",
             f"--bind-ro={REPO}:/casfs-src"],
            stdin=subprocess.DEVNULL, stdout=self.console, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.leader = self._wait_leader()

    def _wait_leader(self) -> int:
        """PID (on the host) of the container's PID 1."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"systemd-nspawn exited {self.proc.returncode}:\n{self.log()}")
            for child in Path("/proc").iterdir():
                if not child.name.isdigit():
                    continue
                with contextlib.suppress(OSError):
                    st = (child / "status").read_text()
                    ppid = int(re.search(r"^PPid:\s+(\d+)", st, re.M).group(1))  # type: ignore[union-attr]
                    nspid = re.search(r"^NSpid:\s+(.*)$", st, re.M).group(1).split()  # type: ignore[union-attr]
                    if ppid == self.proc.pid and nspid[-1] == "1":
                        return int(child.name)
            time.sleep(0.05)
        pytest.fail(f"no container PID 1 after 60 s:\n{self.log()}")

    def log(self) -> str:
        return (self.work / "console.log").read_text(errors="replace")[-4000:]

    def sh(self, script: str, *, check: bool = True, timeout: float = DEADLINE,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``sh -c script`` inside the container, as root, in a clean environment (the
        casfs CLI pointed at the node's state dir and root, as in casfs.toml)."""
        extra = [f"{k}={v}" for k, v in {"CASFS_STATE_DIR": "/var/lib/casfs",
                                         "CASFS_ROOT": "/shared/casfs", **(env or {})}.items()]
        r = subprocess.run(["nsenter", "-t", str(self.leader), "-a", "env", "-i",
                            f"PATH={PATH}", "LANG=C.UTF-8", "HOME=/root", *extra,
                            "sh", "-c", script],
                           capture_output=True, text=True, timeout=timeout, check=False,
                           # its own session: a `kill -9 0` in it (a pid read as 0) reaches
                           # no process of the test run (nsenter keeps the caller's group)
                           start_new_session=True)
        if check and r.returncode != 0:
            pytest.fail(f"in the container: {script!r} exited {r.returncode}:\n"
                        f"{r.stdout}\n{r.stderr}\n{self.why_down()}")
        return r

    def why_down(self) -> str:
        """casfsd's unit state and the journal's last lines: what a failure report needs
        when casfsd is not serving (a failed start, a watchdog abort, a kill)."""
        r = self.sh("systemctl show casfsd -p ActiveState,SubState,Result,NRestarts,"
                    "ExecMainStatus; journalctl -u casfsd --no-pager -n 40;"
                    " echo '-- the whole journal:'; journalctl --no-pager -n 40", check=False)
        return f"casfsd's unit and journal:\n{r.stdout}"

    def kill(self, pid: int, sig: str = "KILL") -> None:
        """``kill -SIG pid`` in the container; a pid that names no one process (0 from
        ``MainPID`` of a casfsd that is down) fails the test instead."""
        assert pid > 1, f"no process to signal (pid {pid}): is casfsd down? {self.why_down()}"
        self.sh(f"kill -{sig} {pid}")

    def show(self, *props: str) -> dict[str, str]:
        out = self.sh(f"systemctl show casfsd -p {','.join(props)}").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait(self, what: str, pred: Any, timeout: float = DEADLINE,
             interval: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            v = pred()
            if v:
                return v
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout:.0f}s waiting for {what};"
                            f" {self.why_down()}")
            time.sleep(interval)

    def journal(self, since_cursor: str | None = None) -> list[dict[str, Any]]:
        after = f" --after-cursor='{since_cursor}'" if since_cursor else ""
        out = self.sh(f"journalctl -u casfsd -o json --no-pager{after}").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def fuse_mounted(self, path: str) -> bool:
        out = self.sh(f"findmnt -n -o FSTYPE --mountpoint {path}", check=False).stdout
        return "fuse" in out

    def stop(self) -> None:
        """Halt the container (SIGTERM to nspawn: a clean shutdown, casfsd stopped by its
        unit), then make sure nothing of it is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.leader, signal.SIGKILL)
                self.proc.kill()
                self.proc.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.leader, signal.SIGKILL)  # outlives a killed nspawn
        self.console.close()
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text()
                  .splitlines() if line.split()[4].startswith(str(self.work) + "/")]
        for mp in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", mp], capture_output=True, check=False)


@pytest.fixture(scope="module")
def box() -> Iterator[Container]:
    why = _missing()
    if why is not None:
        pytest.fail(f"cannot boot systemd in a container here: {why}")
    t0 = time.monotonic()
    r = subprocess.run([str(TREE_SCRIPT), "tree"], capture_output=True, text=True,
                       timeout=900, check=False)
    if r.returncode != 0:
        pytest.fail(f"scripts/systemd-tree.sh tree:\n{r.stderr}")
    tree = Path(r.stdout.strip())
    TIMINGS["tree"] = time.monotonic() - t0
    work = Path(tempfile.mkdtemp(prefix="casfs-sd.", dir="/var/tmp"))
    try:
        t0 = time.monotonic()
        wh = work / "wh"
        r = subprocess.run([str(TREE_SCRIPT), "wheelhouse", str(wh)], capture_output=True,
                           text=True, timeout=600, check=False)
        if r.returncode != 0:
            pytest.fail(f"scripts/systemd-tree.sh wheelhouse:\n{r.stderr}")
        TIMINGS["wheelhouse"] = time.monotonic() - t0
        t0 = time.monotonic()
        c = Container(work, tree, wh)
        try:
            # "offline" until PID 1 listens; --wait: until the boot is done
            state = c.wait("the container's systemd to finish booting", lambda: c.sh(
                "systemctl is-system-running --wait", check=False).stdout.strip() in (
                    "running", "degraded") and c.sh("systemctl is-system-running",
                                                    check=False).stdout.strip(), timeout=120)
            if state == "degraded":
                failed = c.sh("systemctl --failed --no-pager", check=False).stdout
                assert "casfs" not in failed, failed
            TIMINGS["boot"] = time.monotonic() - t0
            t0 = time.monotonic()
            # daemon/install.sh, as an operator runs it, from the wheel, offline
            out = c.sh('sh /casfs-src/daemon/install.sh --from "$(ls /wh/casfs-*.whl)"',
                       env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wh",
                            "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, timeout=300)
            assert "installed in /opt/casfs" in out.stdout, out.stdout + out.stderr
            write_config(c, level="info")
            TIMINGS["install"] = time.monotonic() - t0
            yield c
        finally:
            c.stop()
    finally:
        subprocess.run(["umount", "-l", str(work / "root")], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
        print("\ntest_systemd timings (s): " + ", ".join(
            f"{k} {v:.1f}" for k, v in TIMINGS.items()))


def write_config(c: Container, *, level: str, extra: str = "", raw: str | None = None) -> None:
    text = raw if raw is not None else CONFIG.format(level=level, extra=extra)
    (c.merged / "etc" / "casfs" / "casfs.toml").write_text(text)


def main_pid(c: Container) -> int:
    return int(c.show("MainPID")["MainPID"])


def worker_pids(c: Container) -> dict[str, int]:
    out = c.sh("casfs status --json").stdout
    return {m["name"]: int(m["pid"]) for m in json.loads(out)}


def published(c: Container, namespace: str) -> set[str]:
    r = c.sh(f"casfs ls -r {namespace} --json", check=False)
    if r.returncode != 0:
        return set()
    return {e["path"] for e in json.loads(r.stdout) if e.get("type") != "dir"}


# --- the tests, in order, on one container ---------------------------------------------


def test_start_returns_once_ready_and_status_shows_casfsd_line(box: Container) -> None:
    c = box
    t0 = time.monotonic()
    c.sh("systemctl start --no-block casfsd")
    seen: set[str] = set()

    def active() -> bool:
        s = c.show("ActiveState", "SubState", "StatusText")
        seen.add(f"{s['ActiveState']}/{s['SubState']}")
        if s["ActiveState"] == "activating":
            # not ready yet: the mount may not serve (READY=1 comes after every mount)
            return False
        assert s["ActiveState"] == "active", s
        return True

    c.wait("casfsd active", active, interval=0.02)
    TIMINGS["start"] = time.monotonic() - t0
    assert "activating/start" in seen, seen  # Type=notify: systemd waited for READY=1
    assert c.fuse_mounted("/run/casfs/kern")
    assert c.fuse_mounted("/run/casfs/ns")
    status = c.show("StatusText", "Type", "NotifyAccess", "MainPID")
    assert status["Type"] == "notify"
    assert re.fullmatch(r"1/1 mounts up: kern@\d+; on demand: 0 namespaces at /run/casfs/ns;"
                        r" 0 files pending publication; 0 restarts", status["StatusText"]), status
    out = c.sh("systemctl status casfsd --no-pager", check=False).stdout
    assert f'Status: "{status["StatusText"]}"' in out, out
    assert "Active: active (running)" in out, out
    # systemctl start (blocking) on an active unit returns at once; restart waits again
    t0 = time.monotonic()
    c.sh("systemctl restart casfsd")
    TIMINGS["restart"] = time.monotonic() - t0
    assert c.show("ActiveState")["ActiveState"] == "active"
    assert c.fuse_mounted("/run/casfs/kern")  # served when systemctl restart returned


def test_stop_publishes_what_is_stable(box: Container) -> None:
    c = box
    # a static mount: written by root (the mount's tenant), stable after 0.5 s
    c.sh("echo static > /run/casfs/kern/static.txt")
    # a job's own namespace through casfsd's jobs socket (casfs env), as a user would
    c.sh('eval "$(casfs env --family generic --namespace job-ns)" && '
         'echo "$CASFS_CACHE_DIR" > /root/job-dir && '
         'echo from-a-job > "$CASFS_CACHE_DIR/job.txt" && sleep 1')
    job_dir = c.sh("cat /root/job-dir").stdout.strip()
    assert job_dir.startswith("/run/casfs/ns/"), job_dir
    time.sleep(1.5)  # stable_after (0.5 s) passes; publish_interval (an hour) does not
    assert published(c, "kern-ns") == set()
    t0 = time.monotonic()
    c.sh("systemctl stop casfsd")
    TIMINGS["stop"] = time.monotonic() - t0
    assert c.show("ActiveState")["ActiveState"] == "inactive"
    assert published(c, "kern-ns") == {"static.txt"}
    job_ns = [n for n in c.sh("ls /shared/casfs/namespaces", check=False).stdout.split()
              if "job-ns" in n]
    assert job_ns, c.sh("ls -R /shared/casfs | head -50", check=False).stdout
    assert any("job.txt" in published(c, n) for n in job_ns), job_ns
    assert not c.fuse_mounted("/run/casfs/kern")
    msgs = [e["MESSAGE"] for e in c.journal()]
    assert any(re.search(r"kern: unmounted /run/casfs/kern; last publication: .*1", m)
               for m in msgs), msgs[-20:]
    c.sh("systemctl start casfsd")


def test_reload_applies_a_new_mount_and_log_level(box: Container) -> None:
    c = box
    pid = main_pid(c)
    before = worker_pids(c)
    cursor = c.journal()[-1]["__CURSOR"]
    write_config(c, level="debug", extra=EXTRA_MOUNT)
    t0 = time.monotonic()
    c.sh("systemctl reload casfsd")

    def reloaded() -> str | None:
        return next((e["MESSAGE"] for e in c.journal(cursor)
                     if e["MESSAGE"].startswith("casfs.daemon.main: reloaded")), None)

    line = c.wait("the reload's journal line", reloaded)
    c.wait("casfsd active after the reload",
           lambda: c.show("ActiveState")["ActiveState"] == "active")
    TIMINGS["reload"] = time.monotonic() - t0
    assert line.endswith("log level info -> debug; extra added"), line
    assert main_pid(c) == pid  # reloaded, not restarted
    after = worker_pids(c)
    assert after["kern"] == before["kern"]  # the unchanged mount kept its process
    assert "extra" in after and c.fuse_mounted("/run/casfs/extra")
    assert "2/2 mounts up" in c.show("StatusText")["StatusText"]
    c.sh("echo via-extra > /run/casfs/extra/x.txt && cat /run/casfs/extra/x.txt")

    # a file that does not load: one ERROR line, and casfsd serves on unchanged
    cursor = c.journal()[-1]["__CURSOR"]
    write_config(c, level="debug", raw=CONFIG.format(level="debug", extra=EXTRA_MOUNT).replace(
        'mount_base = "/run/casfs"\n', 'mount_base = "/run/casfs"\nno_such_key = 1\n'))
    c.sh("systemctl reload casfsd")
    refused = c.wait("the refusal", lambda: [e for e in c.journal(cursor)
                                             if "reload refused" in e["MESSAGE"]])
    assert len(refused) == 1 and refused[0]["PRIORITY"] == "3", refused
    assert refused[0]["MESSAGE"] == (
        "casfs.daemon.main: reload refused: /etc/casfs/casfs.toml: node.no_such_key: unknown"
        " key; still serving the configuration loaded before"), refused
    c.wait("casfsd active", lambda: c.show("ActiveState")["ActiveState"] == "active")
    assert main_pid(c) == pid and worker_pids(c) == after
    write_config(c, level="debug", extra=EXTRA_MOUNT)


def start_job(c: Container, mp: str) -> None:
    """tests/node/test_handover.py's job (held, mapped, cwd files; a loop of reads and
    writes) in the container, on mount ``mp``."""
    from tests.node.test_handover import JOB

    (c.merged / "root" / "job.py").write_text(JOB)
    c.sh(f"printf 'seed bytes\\n' > {mp}/seed.txt && mkdir -p {mp}/out && python3 -c"
         f" \"open('{mp}/mapped.bin', 'wb').write(b'mapped' + bytes(8192))\"")
    c.sh(f"rm -f /run/casfs/stop-job /root/job-report.json; setsid python3 /root/job.py {mp}"
         " /root/job-report.json '' </dev/null >/root/job.out 2>&1 &")


def stop_job(c: Container) -> dict[str, Any]:
    c.sh("touch /run/casfs/stop-job")
    c.wait("the job's report", lambda: (c.merged / "root" / "job-report.json").exists()
           and (c.merged / "root" / "job-report.json").stat().st_size > 0)
    time.sleep(0.5)  # written in one go, closed at exit
    return dict(json.loads((c.merged / "root" / "job-report.json").read_text()))


def test_restart_and_kill_of_casfsd_never_reach_a_job(box: Container) -> None:
    c = box
    mp = "/run/casfs/kern"
    start_job(c, mp)
    time.sleep(1.0)
    kern = worker_pids(c)["kern"]
    pid = main_pid(c)
    t0 = time.monotonic()
    c.sh("systemctl restart casfsd")
    TIMINGS["restart-under-job"] = time.monotonic() - t0
    assert main_pid(c) != pid
    assert worker_pids(c)["kern"] == kern  # adopted: the job's mount process serves on
    # A reload that changes the job's mount: a new mount process takes it over (the
    # old one drains what the job holds: its cwd, open and mapped files).
    cursor = c.journal()[-1]["__CURSOR"]
    write_config(c, level="debug", raw=CONFIG.format(level="debug", extra=EXTRA_MOUNT).replace(
        'namespace = "kern-ns"\n', 'namespace = "kern-ns"\nstable_after = 0.4\n'))
    c.sh("systemctl reload casfsd")
    c.wait("the handover's journal line", lambda: [
        e for e in c.journal(cursor) if f"took over {mp} from pid {kern}" in e["MESSAGE"]])
    c.wait("the new mount process", lambda: worker_pids(c).get("kern") not in (None, kern))
    kern = worker_pids(c)["kern"]
    pid = main_pid(c)
    c.kill(pid)
    c.wait("systemd to restart casfsd", lambda: (
        main_pid(c) not in (0, pid) and c.show("ActiveState")["ActiveState"] == "active"))
    assert worker_pids(c)["kern"] == kern
    time.sleep(1.0)
    report = stop_job(c)
    assert report["errors"] == [] and report["slow"] == [], report
    assert report["loops"] > 20, report
    msgs = [e["MESSAGE"] for e in c.journal()]
    assert any(f"adopted the running mount process pid {kern}" in m for m in msgs)


def test_a_killed_mount_process_never_reaches_a_job(box: Container) -> None:
    """kill -9 of the mount process (not casfsd): casfsd holds its FUSE connection and a
    new process serves it (casfs.view.adopt): the job's held, mapped and cwd files carry
    on; its requests wait, none fails."""
    c = box
    mp = "/run/casfs/kern"
    start_job(c, mp)
    time.sleep(1.0)
    kern, pid = worker_pids(c)["kern"], main_pid(c)
    cursor = c.journal()[-1]["__CURSOR"]
    c.kill(kern)
    c.wait("a new mount process", lambda: worker_pids(c).get("kern") not in (None, kern))
    time.sleep(1.0)
    report = stop_job(c)
    assert report["errors"] == [], report
    # A crash is a wait (the new process's start), not a failure: bounded, not zero.
    assert all(float(s.rsplit(" ", 1)[1].rstrip("s")) < 5.0 for s in report["slow"]), report
    TIMINGS["mount-process-kill-worst-op"] = report["worst"]
    assert main_pid(c) == pid
    msgs = [e["MESSAGE"] for e in c.journal(cursor)]
    assert any(f"serves the connection of pid {kern}" in m for m in msgs), msgs[-20:]


def test_sigkill_restarts_casfsd_and_it_serves_again(box: Container) -> None:
    c = box
    pid = main_pid(c)
    restarts = int(c.show("NRestarts")["NRestarts"])
    t0 = time.monotonic()
    c.kill(pid)
    c.wait("systemd to restart casfsd", lambda: (
        int(c.show("NRestarts")["NRestarts"]) > restarts
        and c.show("ActiveState")["ActiveState"] == "active"))
    TIMINGS["sigkill-restart"] = time.monotonic() - t0
    assert main_pid(c) != pid
    assert c.fuse_mounted("/run/casfs/kern")
    # the file published at the stop is served by the restarted casfsd
    assert c.sh("cat /run/casfs/kern/static.txt").stdout == "static\n"
    c.sh("echo after-kill > /run/casfs/kern/after.txt")
    assert "1/1 mounts up" in c.show("StatusText")["StatusText"] or \
        "2/2 mounts up" in c.show("StatusText")["StatusText"]


def test_journal_carries_casfs_lines_with_their_priority(box: Container) -> None:
    c = box
    entries = [e for e in c.journal() if e.get("_PID") != "1"]
    # journald took the <N> prefixes (casfs.node.logfmt) as priorities, off the text
    assert not [e for e in entries if re.match(r"<\d>", e["MESSAGE"])]
    by_prio: dict[str, list[str]] = {}
    for e in entries:
        by_prio.setdefault(e["PRIORITY"], []).append(e["MESSAGE"])
    assert any(m.startswith("casfs.daemon.main: ready: ") for m in by_prio["6"])
    assert any("reload refused" in m for m in by_prio["3"])
    assert by_prio.get("7"), "no debug line after the reload to level debug"
    # the mount processes' lines carry their mount's tag and their own priorities
    assert any(m.startswith("[kern] ") for m in by_prio["6"])
    # casfsd and its workers log under the unit (SYSLOG_IDENTIFIER casfsd)
    assert {e.get("SYSLOG_IDENTIFIER") for e in entries} >= {"casfsd"}


def test_watchdog_aborts_and_restarts_a_wedged_casfsd(box: Container) -> None:
    c = box
    s = c.show("WatchdogUSec", "WatchdogTimestampMonotonic")
    assert s["WatchdogUSec"] == "30s", s
    first = int(s["WatchdogTimestampMonotonic"])
    # the pings: WATCHDOG=1 every ~7.5 s moves systemd's watchdog timestamp
    c.wait("a WATCHDOG=1 ping", lambda: int(
        c.show("WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]) > first,
        timeout=30, interval=0.5)
    pid = main_pid(c)
    restarts = int(c.show("NRestarts")["NRestarts"])
    cursor = c.journal()[-1]["__CURSOR"]
    t0 = time.monotonic()
    c.kill(pid, "STOP")
    c.wait("systemd to restart the wedged casfsd", lambda: (
        int(c.show("NRestarts")["NRestarts"]) > restarts
        and c.show("ActiveState")["ActiveState"] == "active"), timeout=150, interval=0.5)
    TIMINGS["watchdog-restart"] = time.monotonic() - t0
    assert main_pid(c) != pid
    msgs = [e["MESSAGE"] for e in c.journal(cursor)]
    assert any("Watchdog timeout" in m for m in msgs), msgs
    assert any("Failed with result 'watchdog'" in m for m in msgs), msgs
    # SIGABRT (systemd follows it with SIGCONT): faulthandler's stacks, in the journal
    assert "Fatal Python error: Aborted" in msgs, msgs
    assert any(m.startswith("Current thread") or m.startswith("Thread 0x") for m in msgs)
    assert c.fuse_mounted("/run/casfs/kern")
    assert c.sh("cat /run/casfs/kern/static.txt").stdout == "static\n"
    # the stable file written before the kill -9 was published by a later worker
    c.sh("systemctl stop casfsd")
    assert "after.txt" in published(c, "kern-ns")
