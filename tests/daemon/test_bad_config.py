"""Every bad configuration is refused at start: one line naming the key, non-zero exit,
nothing mounted."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from fusehelpers import MountedView, mounted

from .conftest import VENV_BIN, write_config


def run_casfsd(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    for k in ("NOTIFY_SOCKET", "JOURNAL_STREAM"):
        env.pop(k, None)
    return subprocess.run([str(VENV_BIN / "casfsd"), "--config", str(cfg), *args],
                          capture_output=True, text=True, timeout=120, env=env)


def assert_refused(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("casfsd: error: "), lines
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def base(tmp: Path, **mount: object) -> dict[str, object]:
    m: dict[str, object] = {"name": "kern", "family": "generic", "namespace": "kern-ns",
                            "path": str(tmp / "mnt" / "kern")}
    m.update(mount)
    return m


def cfg_file(tmp: Path, mounts: list[dict[str, object]] | None = None, *,
             root: Path | str | None = None, state: Path | str | None = None,
             defaults: dict[str, object] | None = None, metrics: str | None = None,
             extra: str = "") -> Path:
    return write_config(
        tmp / "casfs.toml", root=Path(root) if root else tmp / "root",
        state=Path(state) if state else tmp / "state",
        mounts=mounts if mounts is not None else [base(tmp)], defaults=defaults,
        metrics=metrics, extra=extra)


def nothing_mounted(tmp: Path) -> None:
    mnt = tmp / "mnt"
    if mnt.exists():
        for p in mnt.iterdir():
            assert not mounted(p), p
    run = tmp / "state" / "run"
    assert not list(run.glob("*.json")) if run.exists() else True


CASES: dict[str, tuple[str, ...]] = {
    # name: (what to write, ...needles in the error line)
    "unknown-top-key": ("unknown key", "stor"),
    "unknown-mount-key": ("mounts[0].pathh: unknown key",),
    "unknown-defaults-key": ("defaults.stable: unknown key",),
    "wrong-type-number": ("mounts[0].stable_after", "expected a number"),
    "wrong-type-bool": ("defaults.allow_other", "expected true or false"),
    "wrong-type-list": ("mounts[0].exclude", "array"),
    "wrong-type-mounts": ("mounts[0]", "expected a table"),
    "negative-interval": ("defaults.publish_interval", "greater than 0"),
    "bad-bytes": ("node.cache_max_bytes", "byte count"),
    "relative-root": ("store.root", "absolute"),
    "relative-state": ("node.state_dir", "absolute"),
    "relative-path": ("mounts[0].path", "absolute"),
    "mount-in-state": ("mounts[0].path", "inside node.state_dir"),
    "mount-in-root": ("mounts[0].path", "inside store.root"),
    "state-in-mount": ("mounts[0].path", "node.state_dir", "inside the mount point"),
    "duplicate-name": ("mounts[1].name", "already used by mounts[0]"),
    "duplicate-path": ("mounts[1].path", "already mounted by mounts[0]"),
    "nested-paths": ("mounts[1].path", "nested"),
    "duplicate-namespace": ("mounts[1].namespace", "one mount per namespace"),
    "bad-family": ("mounts[0].family", "triton"),
    "bad-namespace": ("mounts[0].namespace", "not \"auto\""),
    "bad-name": ("mounts[0].name", "not a valid mount name"),
    "no-mounts": ("mounts: at least one",),
    "bad-listen": ("metrics.listen", "HOST:PORT"),
    "bad-log-level": ("log.level", "expected one of"),
    "bad-toml": ("invalid TOML",),
    "bad-mode": ("mounts[0].mode", "fuse, overlay, dir"),
}


def make_case(name: str, tmp: Path) -> Path:
    mnt = tmp / "mnt"
    if name == "unknown-top-key":
        return cfg_file(tmp, extra='[stor]\nroot = "/x"\n')
    if name == "unknown-mount-key":
        return cfg_file(tmp, [base(tmp, pathh="/x")])
    if name == "unknown-defaults-key":
        return cfg_file(tmp, defaults={"stable": 1})
    if name == "wrong-type-number":
        return cfg_file(tmp, [base(tmp, stable_after="fast")])
    if name == "wrong-type-bool":
        return cfg_file(tmp, defaults={"allow_other": "yes"})
    if name == "bad-mode":
        return cfg_file(tmp, [base(tmp, mode="tmpfs")])
    if name == "wrong-type-list":
        return cfg_file(tmp, [base(tmp, exclude="*.tmp")])
    if name == "wrong-type-mounts":
        p = cfg_file(tmp, [])
        p.write_text('mounts = ["kern"]\n' + p.read_text())  # top-level key: before any table
        return p
    if name == "negative-interval":
        return cfg_file(tmp, defaults={"publish_interval": -1})
    if name == "bad-bytes":
        p = cfg_file(tmp)
        p.write_text(p.read_text().replace("[node]\n", '[node]\ncache_max_bytes = "lots"\n'))
        return p
    if name == "relative-root":
        return cfg_file(tmp, root="rel/root")
    if name == "relative-state":
        return cfg_file(tmp, state="rel/state")
    if name == "relative-path":
        return cfg_file(tmp, [base(tmp, path="mnt/kern")])
    if name == "mount-in-state":
        return cfg_file(tmp, [base(tmp, path=str(tmp / "state" / "mnt"))])
    if name == "mount-in-root":
        return cfg_file(tmp, [base(tmp, path=str(tmp / "root" / "mnt"))])
    if name == "state-in-mount":
        return cfg_file(tmp, [base(tmp, path=str(tmp / "big"))], state=tmp / "big" / "state")
    if name == "duplicate-name":
        return cfg_file(tmp, [base(tmp), base(tmp, namespace="b", path=str(mnt / "b"))])
    if name == "duplicate-path":
        return cfg_file(tmp, [base(tmp), base(tmp, name="b", namespace="b")])
    if name == "nested-paths":
        return cfg_file(tmp, [base(tmp), base(tmp, name="b", namespace="b",
                                              path=str(mnt / "kern" / "b"))])
    if name == "duplicate-namespace":
        return cfg_file(tmp, [base(tmp), base(tmp, name="b", path=str(mnt / "b"))])
    if name == "bad-family":
        return cfg_file(tmp, [base(tmp, family="jax")])
    if name == "bad-namespace":
        return cfg_file(tmp, [base(tmp, namespace="../evil")])
    if name == "bad-name":
        return cfg_file(tmp, [base(tmp, name="a/b")])
    if name == "no-mounts":  # valid with on-demand namespaces (the default): turned off here
        p = cfg_file(tmp, [])
        p.write_text(p.read_text().replace("[node]\n", "[node]\non_demand = false\n"))
        return p
    if name == "bad-listen":
        return cfg_file(tmp, metrics="localhost")
    if name == "bad-log-level":
        p = cfg_file(tmp)
        p.write_text(p.read_text().replace('level = "debug"', 'level = "loud"'))
        return p
    if name == "bad-toml":
        p = cfg_file(tmp)
        p.write_text(p.read_text() + "[[mounts]\n")
        return p
    raise AssertionError(name)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_config_refused(case: str, tmp_path: Path) -> None:
    cfg = make_case(case, tmp_path)
    assert_refused(run_casfsd(cfg), *CASES[case])
    nothing_mounted(tmp_path)


def test_missing_config_file(tmp_path: Path) -> None:
    line = assert_refused(run_casfsd(tmp_path / "nope.toml"), "cannot read")
    assert "nope.toml" in line


def test_relative_flag_is_made_absolute_and_flags_win(tmp_path: Path) -> None:
    """--state-dir overrides the file; here it points into the mount path, so it is refused
    naming the key the mount conflicts with."""
    cfg = cfg_file(tmp_path)
    assert_refused(run_casfsd(cfg, "--state-dir", str(tmp_path / "mnt" / "kern" / "s")),
                   "mounts[0].path", "node.state_dir")


def test_state_dir_on_fuse_refused(tmp_path: Path) -> None:
    """A state dir on a network or FUSE filesystem (LMDB cannot run there)."""
    lower, upper, mp = tmp_path / "lower", tmp_path / "upper", tmp_path / "fusemnt"
    lower.mkdir()
    with MountedView(lower, upper, mp):
        cfg = cfg_file(tmp_path, state=mp / "state")
        assert_refused(run_casfsd(cfg), "node.state_dir", "fuse")
        nothing_mounted(tmp_path)
