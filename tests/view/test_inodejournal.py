"""The inode table's journal: a crashed process's numbers, rebuilt for its adopter."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from casfs.view import inodejournal
from casfs.view.inodejournal import InodeJournal
from casfs.view.inodes import InodeTable


def _churn(t: InodeTable, rng: random.Random, steps: int) -> dict[int, int]:
    """Lookups, forgets, renames, detaches and hard links; the kernel's counts."""
    names = ["a", "b", "c", "ab", "x\ny"]

    def rand_path() -> str:
        return "/".join(rng.choice(names) for _ in range(rng.randint(1, 3)))

    counts: dict[int, int] = {}
    for _ in range(steps):
        op = rng.random()
        if op < 0.45:
            key = (1, rng.randint(1, 30)) if rng.random() < 0.1 else None
            ino = t.lookup(rand_path(), key)
            counts[ino] = counts.get(ino, 0) + 1
        elif op < 0.6:
            old, new = rand_path(), rand_path()
            if new != old and not new.startswith(old + "/") and not old.startswith(new + "/"):
                t.rename(old, new)
        elif op < 0.7:
            t.detach(rand_path())
        elif op < 0.75:
            ino = t.ino(rand_path())
            t.drop_if_unused(ino)
        elif counts:
            ino = rng.choice(sorted(counts))
            n = rng.randint(1, counts[ino])
            t.forget(ino, n)
            counts[ino] -= n
            if not counts[ino]:
                del counts[ino]
    return counts


def _check(orig: InodeTable, back: InodeTable, held: dict[int, int]) -> None:
    for ino in held:  # every number the kernel holds means what it meant
        assert back.path(ino) == orig.path(ino), ino
        assert back.last_path(ino) == orig.last_path(ino), ino
        assert back.names(ino) == orig.names(ino), ino
    for ino in held:
        p = orig.path(ino)
        if p is not None:
            assert back.find(p) == orig.find(p), p


def test_a_restored_table_means_what_the_dead_one_meant(tmp_path: Path) -> None:
    for seed in range(5):
        j = tmp_path / f"ns{seed}.inodes"
        orig = InodeTable(journal=InodeJournal(j))
        held = _churn(orig, random.Random(seed), 3000)
        back = InodeTable.restore(j)
        _check(orig, back, held)
        # numbers are never reused, across the crash too
        fresh = back.lookup("never/seen/before")
        assert fresh not in orig._path and fresh >= orig._next


def test_restored_inodes_are_held_until_the_mount_ends(tmp_path: Path) -> None:
    j = tmp_path / "j"
    orig = InodeTable(journal=InodeJournal(j))
    a = orig.lookup("d/f")
    back = InodeTable.restore(j)
    back.forget(a, 1)  # the kernel's one lookup: the adopter does not know the count
    assert back.path(a) == "d/f"


def test_the_journal_is_compacted_and_still_restores(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inodejournal, "_COMPACT_AFTER", 200)
    j = tmp_path / "j"
    orig = InodeTable(journal=InodeJournal(j))
    held = _churn(orig, random.Random(11), 5000)
    assert orig.journal is not None
    lines = len(j.read_bytes().splitlines())
    assert lines <= max(200, 4 * len(orig)) + 1, lines  # rewritten as a snapshot
    back = InodeTable.restore(j)
    _check(orig, back, held)


def test_a_torn_last_record_is_dropped(tmp_path: Path) -> None:
    j = tmp_path / "j"
    orig = InodeTable(journal=InodeJournal(j))
    a = orig.lookup("a")
    with open(j, "ab") as f:
        f.write(b'["n",99,"b"')  # the crash came mid-write
    back = InodeTable.restore(j)
    assert back.path(a) == "a" and back.find("b") is None


def test_a_journal_names_its_format_and_another_is_refused(tmp_path: Path) -> None:
    j = tmp_path / "m.1.inodes"
    t = InodeTable(journal=InodeJournal(j))
    ino = t.lookup("a/b")
    assert j.read_bytes().splitlines()[0] == b'["v",1]'
    assert InodeTable.restore(j, to=tmp_path / "m.2.inodes").path(ino) == "a/b"
    assert (tmp_path / "m.2.inodes").read_bytes().splitlines()[0] == b'["v",1]'  # snapshot
    newer = tmp_path / "m.3.inodes"
    newer.write_bytes(b'["v",2]\n["n",2,"a",null]\n')
    with pytest.raises(ValueError, match="inode journal format 2"):
        InodeTable.restore(newer)
