"""Who uses an idle namespace is read from /proc: a hit by path text counts only if the
file itself is the namespace's (a review's note, 2026-12-06). Another user, in a mount
namespace of her own (``unshare -Urm``, a tmpfs over the serve base), could put a
directory at the text of another tenant's namespace path and keep it served for ever
(the tenant's namespaces bound reached, her next job refused a cache). Here the
spoofing process is made as root (``unshare -m``), the genuine one sits in the real
directory; ``owns`` is what the host passes (its mount's device, the slot)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.node import leases


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    out: list[subprocess.Popen[bytes]] = []
    yield out
    for p in out:
        p.kill()
        p.wait()


def _cwd_in(path: Path, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if path.exists():
            return
        time.sleep(0.05)


def test_a_path_forged_in_another_mount_namespace_holds_nothing(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (unshare -m)")
    serve = tmp_path / "serve"
    real = serve / "u1001" / "ns"
    real.mkdir(parents=True)
    mark = tmp_path / "spoof-ready"
    spoof = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs none {serve} && mkdir -p {real} && cd {real} && touch {mark}"
         " && exec sleep 120"])
    procs.append(spoof)
    genuine = subprocess.Popen(["sh", "-c", "exec sleep 120"], cwd=real)
    procs.append(genuine)
    _cwd_in(mark)
    assert mark.exists(), "the spoofing process did not start"
    dev = os.stat(real).st_dev

    by_text = leases.users([str(real)])
    assert {spoof.pid, genuine.pid} <= by_text[str(real)]  # both, by text alone
    by_file = leases.users([str(real)], owns=lambda prefix, d, ino: d == dev)
    assert genuine.pid in by_file[str(real)]
    assert spoof.pid not in by_file[str(real)]
