"""Another user cannot keep a tenant's file from being published by holding a file of
her own at the same path text.

dir and overlay modes defer a file some process holds open for writing
(casfs.view.dirmode.open_for_writing), and decided by the text of
/proc/<pid>/fd/<n>. A user in her own user and mount namespace (`unshare -Urm`, a
tmpfs over the mount base) holds her own file open at the victim's path string:
the victim's file was deferred at every round, the final one too, for as long as
she liked (found by a review on 2026-12-05). Now only the same inode counts.
A real second user; the victim's genuine writer is still seen."""

from __future__ import annotations

import os
import subprocess

import pytest

from casfs.view.dirmode import open_for_writing
from tests.users import open_tmp, real_users


def test_a_path_held_in_another_mount_namespace_does_not_defer_the_file() -> None:
    with open_tmp() as d, real_users(1, d) as (attacker,):
        base = d / "mb"
        mp = base / "triton"
        (mp / "KEY").mkdir(parents=True)
        os.chmod(base, 0o755)
        os.chmod(mp, 0o700)
        (mp / "KEY" / "kernel.cubin").write_bytes(b"victim's kernel")
        rels = ["KEY/kernel.cubin"]
        assert open_for_writing(mp, rels) == set()
        holder = subprocess.Popen(
            ["setpriv", f"--reuid={attacker.uid}", f"--regid={attacker.gid}",
             "--clear-groups", "unshare", "-Urm", "sh", "-c",
             f"mount -t tmpfs x {base} && mkdir -p {mp}/KEY && exec 3>{mp}/KEY/kernel.cubin"
             " && echo holding && exec sleep 60"], stdout=subprocess.PIPE, text=True)
        try:
            line = holder.stdout.readline().strip() if holder.stdout else ""
            if line != "holding":
                pytest.fail(f"the attacker could not set up (user namespaces off?): {line!r}")
            assert open_for_writing(mp, rels) == set()  # her file, not the victim's
            with open(mp / "KEY" / "kernel.cubin", "ab"):  # the victim's own writer
                assert open_for_writing(mp, rels) == {"KEY/kernel.cubin"}
        finally:
            holder.kill()
            holder.wait()
