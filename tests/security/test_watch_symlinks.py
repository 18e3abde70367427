"""The write watch never follows a tenant's symlink out of her tree, with a real user.

casfsd (root) watches a dir-mode directory, and an overlay's upper, that a
tenant writes (casfs.view.inowatch): each new directory gets a watch and is
listed. Done by path, a directory swapped for a symlink between its event
and its watch would put root's watch on whatever it points at (a root-only
directory here): its files' events reported as the tenant's, root's
node-wide inotify watches spent there. Every directory is opened beneath the
tree with no symlink followed and watched through that fd.

The tenant races the watcher for two seconds (make a directory, swap it for a
symlink to a root-only directory, again and again); the inotify fd's
fdinfo, which lists the inode of every watch, must never show that directory.
"""

from __future__ import annotations

import os

from waiting import wait_idle

from casfs.promote.tracker import WriteTracker
from casfs.view import dirmode
from casfs.view.inowatch import TreeWatch
from tests.users import open_tmp, real_users


def _watched_inodes(w: TreeWatch) -> set[int]:
    """Inodes the watch's inotify instance holds (fdinfo: ``inotify wd:.. ino:<hex>``)."""
    out: set[int] = set()
    with open(f"/proc/self/fdinfo/{w._fd}") as f:
        for line in f:
            if line.startswith("inotify wd:"):
                fields = dict(kv.split(":", 1) for kv in line.split()[1:] if ":" in kv)
                out.add(int(fields["ino"], 16))
    return out


def test_a_directory_swapped_for_a_symlink_is_never_watched() -> None:
    with open_tmp() as d, real_users(1, d) as users:
        user = users[0]
        secret = d / "rootonly"
        secret.mkdir(mode=0o700)
        (secret / "sub").mkdir()
        tree = d / "cache"
        tree.mkdir()
        os.chown(tree, user.uid, user.gid)
        tracker = WriteTracker()
        w = dirmode.watch(tree, tracker)
        assert isinstance(w, TreeWatch)
        try:
            race = (f"cd {tree} && end=$(($(date +%s) + 2)); i=0; "
                    f"while [ $(date +%s) -lt $end ]; do i=$((i+1)); "
                    f"mkdir k$i && touch k$i/f && mv k$i k$i.real && ln -s {secret} k$i; "
                    f"mkdir k$i.new && rmdir k$i.new; done; echo $i")
            r = user.sh(race, timeout=60)
            assert r.returncode == 0, r.stderr
            rounds = int(r.stdout.split()[-1])
            assert rounds > 10
            # root writes in its own directory meanwhile: no event of it is the tenant's
            (secret / "sub" / "root-file").write_bytes(b"x")
            wait_idle(w)
            watched = _watched_inodes(w)
            assert os.stat(tree).st_ino in watched
            assert os.stat(secret).st_ino not in watched
            assert os.stat(secret / "sub").st_ino not in watched
            dirty = tracker.quiet(0.0)
            assert not any("root-file" in p for p in dirty)
            assert any(p.endswith(".real/f") for p in dirty)  # the tenant's own are seen
        finally:
            w.stop()
            w.join(5)
