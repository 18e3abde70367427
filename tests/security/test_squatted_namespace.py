"""A namespace squatted on a shared multi-user root without casfsd is reported, not
skipped silently (issue 21, denial of service).

Another user creates ``namespaces/u<victim>~<ns>`` first. Without casfsd (root)
nobody can move it aside, so the victim publishes nothing there; before, nothing
said so (a warning in the mount process's log, every publish interval). Now the
job's summary line says it once and ``casfs doctor`` names the directory and
its owner. The victim's job itself is never hurt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.store.root import SharedRoot, open_to_users
from tests.users import RealUser, open_tmp, real_users

pytestmark = [pytest.mark.slow]


@pytest.fixture
def shared() -> Iterator[Path]:
    with open_tmp() as d:
        SharedRoot.open(d / "root", create=True)
        open_to_users(d / "root")  # casfs init --multi-user: 1777 namespaces/
        yield d


def env(user: RealUser, shared: Path) -> dict[str, str]:
    return user.env(CASFS_ROOT=str(shared / "root"), CASFS_STATE_DIR=str(user.home / "state"),
                    CASFS_MOUNT_BASE=str(user.home / "mnt"),
                    CASFS_SOCKET=str(user.home / "no-daemon.sock"))


@pytest.mark.expect_log(
    r"not serving namespace \S+~myns: .* is owned by uid \d+, outside tenant",
    r"cannot read generations of \S+~myns: .* outside tenant",
    r"not publishing to \S+~myns: .* outside tenant",
)
def test_a_squatted_namespace_is_reported_by_the_job_and_by_doctor(shared: Path) -> None:
    with real_users(2, shared) as (victim, attacker):
        ns = f"{victim.tenant}~myns"
        planted = shared / "root" / "namespaces" / ns
        attacker.sh(f"mkdir -m 755 {planted} {planted}/generations", check=True)
        r = victim.casfs("run", "--mode", "dir", "--family", "generic", "--namespace", "myns",
                         "--stable-after", "0", "--", "/bin/sh", "-c",
                         'echo k > "$CASFS_CACHE_DIR/kernel.so"', env=env(victim, shared))
        assert r.returncode == 0, r.stderr  # the job itself is never hurt
        lines = [ln for ln in r.stderr.splitlines() if "NOT PUBLISHED" in ln]
        assert len(lines) == 1, r.stderr
        assert str(planted) in lines[0] and f"uid {attacker.uid}" in lines[0], r.stderr
        assert not any((planted / "generations").iterdir())
        d = victim.casfs("doctor", "--json", env=env(victim, shared))
        import json

        checks = {c["check"]: c for c in json.loads(d.stdout)}
        ns_check = checks["namespaces"]
        assert ns_check["status"] == "warn", d.stdout
        assert str(planted) in ns_check["detail"] and f"uid {attacker.uid}" in ns_check["detail"]
        # The attacker's own doctor sees nothing of its own squatted.
        d = attacker.casfs("doctor", "--json", env=env(attacker, shared))
        checks = {c["check"]: c for c in json.loads(d.stdout)}
        assert checks["namespaces"]["status"] == "ok", d.stdout
