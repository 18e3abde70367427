"""The namespaces related to a job's (casfs.cli.nearest): their newest records are read
several at once, from one listing, and only those of the families asked about."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from casfs.cli.nearest import newest_records
from casfs.errors import CasfsError


class _Gens:
    """A root's generations whose reads of a newest record meet at a barrier: read one
    after the other, the first never gets past it."""

    def __init__(self, names: list[str], meet: int) -> None:
        self.names = names
        self.barrier = threading.Barrier(meet, timeout=5)
        self.asked: list[str] = []
        self.lists = 0

    def namespaces(self) -> list[str]:
        self.lists += 1
        return list(self.names)

    def latest(self, ns: str) -> Any:
        self.asked.append(ns)
        if ns.endswith("-bad"):
            raise CasfsError(f"{ns}: a damaged record")
        self.barrier.wait()
        return f"record of {ns}"


def test_the_newest_records_are_read_at_once() -> None:
    names = [f"triton-{i:04x}" for i in range(4)] + ["inductor-0001", "alice~triton-0009",
                                                      "bob~triton-000a", "triton-bad"]
    gens = _Gens(names, meet=5)  # the five readable triton namespaces of alice or none
    got = newest_records(gens, {"triton"}, "alice")
    assert gens.lists == 1
    want = [f"triton-{i:04x}" for i in range(4)] + ["alice~triton-0009", "triton-bad"]
    assert sorted(got) == sorted(want)  # not inductor's, not bob's
    assert got["triton-bad"] is None  # unreadable: left out of the comparison, no error
    assert got["triton-0000"] == "record of triton-0000"
    assert sorted(gens.asked) == sorted(want)


def test_one_namespace_is_read_in_this_thread() -> None:
    gens = _Gens(["triton-0001"], meet=1)
    assert newest_records(gens, {"triton"}) == {"triton-0001": "record of triton-0001"}
    assert newest_records(gens, {"vllm"}) == {}


def test_an_unreadable_namespace_is_left_out_and_a_bug_is_raised() -> None:
    class Broken(_Gens):
        def latest(self, ns: str) -> Any:
            if ns == "triton-0001":
                raise PermissionError(13, "Permission denied")  # another user's, 0700
            if ns == "triton-0003":
                raise KeyError(ns)
            return f"record of {ns}"

    got = newest_records(Broken(["triton-0001", "triton-0002"], meet=1), {"triton"})
    assert got == {"triton-0001": None, "triton-0002": "record of triton-0002"}
    with pytest.raises(KeyError):
        newest_records(Broken(["triton-0002", "triton-0003"], meet=1), {"triton"})
