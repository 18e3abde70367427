"""Storing a small object on an object store: one create-only PUT, no HEAD before it
(a round trip each); an object already there is still verified, and repaired."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from casfs.store.objects import object_key
from casfs.store.root import SharedRoot


class _Calls:
    """The backend, with the verbs called on it in order."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)
        return call


def _recorded(root: SharedRoot) -> _Calls:
    calls = _Calls(root.objects.backend)
    root.objects.backend = calls  # type: ignore[assignment]
    return calls


@pytest.mark.expect_log(r"repaired damaged object", r"rejected object: .*truncated header")
def test_a_new_object_is_one_put_on_an_object_store(s3_url: str) -> None:
    root = SharedRoot.open(s3_url, create=True)
    rec = _recorded(root)
    data = b"a freshly compiled kernel" * 40
    put = root.objects.put_bytes(data)
    assert put.created and rec.calls == ["put_if_absent"]
    rec.calls.clear()
    again = root.objects.put_bytes(data)  # there: found by the PUT, then verified
    assert not again.created and rec.calls[0] == "put_if_absent"
    assert "info" not in rec.calls and "replace" not in rec.calls
    # Damaged under its name (torn, or planted): the PUT finds it, the check fails,
    # verified bytes replace it.
    staged = Path(root.objects.backend.staging_dir) / "garbage"
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_bytes(b"not the object")
    root.backend.replace(object_key(put.digest), staged)
    rec.calls.clear()
    fixed = root.objects.put_bytes(data)
    assert fixed.created and rec.calls[0] == "put_if_absent" and "replace" in rec.calls
    assert root.objects.counters.get("objects_repaired") == 1
    assert root.objects.get_bytes(put.digest) == data


def test_a_posix_root_still_stats_first(tmp_path: Path) -> None:
    """A stat is cheap: an object already stored is neither compressed nor written."""
    root = SharedRoot.open(tmp_path / "root", create=True)
    data = b"bytes" * 100
    root.objects.put_bytes(data)
    rec = _recorded(root)
    assert not root.objects.put_bytes(data).created
    assert rec.calls[0] == "info" and "put_if_absent" not in rec.calls
