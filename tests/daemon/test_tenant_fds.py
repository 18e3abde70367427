"""One tenant cannot take the shared mount process's file descriptors from the others.

Every file a job holds open through casfsd's on-demand mount can be a descriptor
of that one process, and its open-file limit is every tenant's. A tenant holding
thousands of handles (several processes, each within its own limit) took them
all: another tenant's creates and opens failed with EMFILE, and the lease check,
reading /proc with none left, took every lease's holder for gone and released
their namespaces from under running jobs (found by a review on 2026-12-06). A
tenant may now hold a quarter of the process's limit; past it, its own opens get
EMFILE, and a lease is never dropped for want of a descriptor to check it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.users import open_tmp, real_users, user_python

from .conftest import VENV_BIN, Daemon
from .test_tenants import FAST, Job, ok

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

LIMIT = 600  # the mount process's open-file limit here: a tenant may hold 150 handles
HOLD = r"""
import os, sys, time
p = sys.argv[1] + "/held"
with open(p, "wb") as f:
    f.write(b"x")
fds, err = [], "none"
try:
    for _ in range(int(sys.argv[2])):
        fds.append(os.open(p, os.O_RDONLY))
except OSError as e:
    err = e.strerror
print(len(fds), err, flush=True)
time.sleep(300)
"""


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    with open_tmp() as d:
        yield d


@pytest.mark.expect_log(r"tenant u\d+ holds \d+ open files on this node's mount",
                        r"a job was killed: \d+ files it may have been writing")
def test_a_tenant_holding_many_handles_leaves_the_others_their_files_and_leases(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemons("a", [], defaults=FAST, node={"lease_grace": 0.5}, start=False)
    wrapper = tmp_path / "casfsd-limited"
    wrapper.write_text(f"#!/bin/sh\nexec prlimit --nofile={LIMIT}:{LIMIT} --"
                       f" {VENV_BIN / 'casfsd'} \"$@\"\n")
    wrapper.chmod(0o755)
    d.casfsd = wrapper
    d.start()
    py, _ = user_python()
    with real_users(2, tmp_path) as (victim, attacker):
        v, a = Job(victim, d), Job(attacker, d)
        hold = None
        try:
            ok(victim.sh(f"echo before > {v.path}/before"))
            hold = attacker.popen([py, "-c", HOLD, str(a.path), str(LIMIT + 100)])
            assert hold.stdout is not None
            got, why = hold.stdout.readline().split(" ", 1)
            # She got her share and no more: her own opens past it are refused.
            assert LIMIT // 4 - 5 <= int(got) <= LIMIT // 4, (got, why)
            assert "Too many open files" in why
            # The victim, meanwhile: creates, reads, lists, as ever.
            for i in range(3):
                ok(victim.sh(f"echo during{i} > {v.path}/during{i} && cat {v.path}/during{i}"
                             f" && cat {v.path}/before && ls {v.path} >/dev/null"))
                time.sleep(0.5)  # lease checks run meanwhile (lease_poll 1 s)
        finally:
            if hold is not None:
                hold.kill()
                hold.wait(30)
        try:
            time.sleep(2.5)  # more lease checks and the grace: her lease still stands
            assert ok(victim.sh(f"cat {v.path}/during2")) == "during2\n"
            assert v.proc.poll() is None and os.path.isdir(v.path)
            ok(attacker.sh(f"cat {a.path}/held >/dev/null"))  # hers work again too
            assert (f"tenant {attacker.tenant} holds {LIMIT // 4} open files on this node's"
                    " mount") in d.log()  # an operator's grep finds who
            # and `casfs status` shows the bound and how often it refused
            st = re.search(r"^on-demand mount at .*: \d+ leases; open files at most (\d+) a"
                           r" tenant, (\d+) refused$", d.cli("status").stdout, re.M)
            assert st is not None and int(st[1]) == LIMIT // 4 and int(st[2]) >= 1, st
        finally:
            v.stop()
            a.stop()
