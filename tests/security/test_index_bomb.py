"""A tenant's commit record cannot cost root's shared promotion worker without bound.

vLLM's ``vllm_compile_cache.py`` is a Python dict literal that casfs parses (as
root, in the promotion worker every tenant's namespaces share) to learn which
artifacts it names. ``ast.literal_eval`` takes ~470 bytes of memory a byte of
source, and an index naming an artifact that never comes is never ready, so it
was read and parsed again every round: a review's 10 MB index took the worker to
4.7 GB and a core, and another tenant's publication from 0.5 s to 9 s, with
nothing in the log. A record past ``families.MAX_PARSED_BYTES`` is now not in
the format: never read or parsed, never published, said once in the log.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from waiting import wait_until

from casfs.families import MAX_PARSED_BYTES
from tests.daemon import conftest as daemon_conftest
from tests.daemon.conftest import Daemon
from tests.users import RealUser, open_tmp, real_users, user_python

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

daemons = daemon_conftest.daemons  # the fixture: a real casfsd per test

FAST = {"stable_after": 0.2, "publish_interval": 0.5, "refresh_interval": 1.0}


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Overrides pytest's (root-only 0700) so the users can reach the jobs socket."""
    with open_tmp() as d:
        yield d


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _workers(d: Daemon) -> list[int]:
    """The promotion workers of this casfsd (their command line names its state)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"promoteworker" in cmd and str(d.state).encode() in cmd:
            out.append(int(p))
    return out


def _job(user: RealUser, d: Daemon, family: str, var: str, script: str) -> str:
    """``casfs env --family`` as ``user`` through the jobs socket, then ``script`` in
    that shell (its cache dir is ``$var``); the dir it got."""
    py, _ = user_python()
    env = user.env(CASFS_SOCKET=str(d.state.parent / "mnt-base" / "casfsd.sock"),
                   CASFS_ROOT=str(d.root), CASFS_STATE_DIR=str(user.home / "state"),
                   CASFS_BUILD_KEY="bomb", CASFS_LEASE_TIMEOUT="60", PY=py)
    r = user.run(["/bin/sh", "-c", f'eval "$({py} -m casfs.cli.main env --family {family})"'
                  f' && {script} && echo "${var}"'], env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip(), (r.stdout, r.stderr)
    return r.stdout.strip().splitlines()[-1]


# past the items bound; past the bytes bound; under both, but no literal (a review's
# 8 MiB chained comparison: no separator, bracket or quote for the items to count)
INDEXES = {"4mb-items": "\"{'x': {'graph_handle': ('artifact_missing', 'p'), 'pad': [\""
                        " + '0,' * 2_000_000 + ']}}'",
           "10mb-bytes": "\"{'x': {'graph_handle': ('artifact_missing', 'p'), 'pad': [\""
                         " + '0,' * 5_000_000 + ']}}'",
           "8mb-chain": "'1<' * 4_194_296 + '1'"}


@pytest.mark.expect_log(r"not publishing torch_compile_cache/.*vllm_compile_cache\.py: "
                        r"a commit record of \d+ bytes, past the")
@pytest.mark.parametrize("index", list(INDEXES))
def test_an_oversized_vllm_index_is_never_parsed_by_the_shared_worker(
        daemons: Callable[..., Daemon], tmp_path: Path, index: str) -> None:
    """The old code's worker peaked at ~1.9 GB on the 4 MB one, 4.7 GB on 10 MB, and
    3.5 GB on the chain (after the first bounds: only the chain)."""
    d = daemons("a", [], defaults=FAST, node={"lease_grace": 30})
    with real_users(2, tmp_path) as (attacker, victim):
        # Her index names an artifact that never comes, padded; or is no literal at all.
        rel = "torch_compile_cache/h/rank_0_0/backbone/vllm_compile_cache.py"
        gen = tmp_path / "gen_index.py"
        gen.write_text(f"import sys\nopen(sys.argv[1], 'w').write({INDEXES[index]})\n")
        gen.chmod(0o644)
        theirs = _job(attacker, d, "vllm", "VLLM_CACHE_ROOT",
                      f'mkdir -p "$VLLM_CACHE_ROOT/{os.path.dirname(rel)}" && "$PY" {gen}'
                      f' "$VLLM_CACHE_ROOT/{rel}"')
        size = os.path.getsize(os.path.join(theirs, rel))
        # Rounds go by (publish_interval 0.5 s): the worker's memory, sampled.
        peak = 0.0
        end = time.monotonic() + 8
        while time.monotonic() < end:
            peak = max([peak, *(_rss_mb(p) for p in _workers(d))])
            time.sleep(0.05)
        assert _workers(d), "no promotion worker ran"
        # The old code parsed it every round: ~1.9 GB. Now it is never read.
        assert peak < 400, f"the shared promotion worker peaked at {peak:.0f} MB"
        # Another tenant publishes as ever, and her index was never published.
        mine = _job(victim, d, "generic", "CASFS_CACHE_DIR", 'echo v > "$CASFS_CACHE_DIR/v"')
        ns = f"{victim.tenant}~{Path(mine).name}"
        wait_until(lambda: "v" in d.published(ns), "the other tenant's file published")
        her_ns = f"{attacker.tenant}~{Path(theirs).name}"
        assert rel not in d.published(her_ns)
        said = [ln for ln in d.log().splitlines() if "not publishing" in ln and rel in ln]
        if size > MAX_PARSED_BYTES:  # never read: a WARNING naming the bound
            assert said and all("WARNING" in ln and "past the" in ln for ln in said), said
        else:  # read, its items counted, never parsed
            assert said and all("INFO" in ln and "not in its family's format" in ln
                                for ln in said), said
