"""Namespace fingerprints: stable, sensitive to the build key, validated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from casfs import families
from casfs.errors import UsageError
from casfs.fingerprint import (
    Fingerprint,
    check_namespace,
    differences,
    fingerprint,
    job_env,
    resolve_interpreter,
    resolve_namespace,
)

JOB = job_env(python=sys.executable)  # the job: this interpreter (it has torch and triton)


def test_same_host_gives_same_namespace() -> None:
    for family in families.names():
        assert fingerprint(family, JOB).namespace == fingerprint(family, JOB).namespace


def test_namespace_format_and_key_order_independence() -> None:
    a = Fingerprint("triton", {"python": "cpython-3.11", "torch": None})
    b = Fingerprint("triton", {"torch": None, "python": "cpython-3.11"})
    assert a.namespace == b.namespace
    family, _, digest = a.namespace.partition("-")
    assert family == "triton"
    assert len(digest) == 16 and int(digest, 16) >= 0
    c = Fingerprint("triton", {"python": "cpython-3.12", "torch": None})
    assert c.namespace != a.namespace


def test_build_key_changes_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASFS_BUILD_KEY", raising=False)
    base = fingerprint("inductor", JOB)
    assert base.ingredients["build_key"] is None
    monkeypatch.setenv("CASFS_BUILD_KEY", "image-1234")
    keyed = fingerprint("inductor", JOB)
    assert keyed.ingredients["build_key"] == "image-1234"
    assert keyed.namespace != base.namespace
    monkeypatch.setenv("CASFS_BUILD_KEY", "image-5678")
    assert fingerprint("inductor", JOB).namespace not in (base.namespace, keyed.namespace)


def test_family_ingredients() -> None:
    full = fingerprint("triton", JOB).ingredients
    for key in (
        "python",
        "platform",
        "arch",
        "libc",
        "torch",
        "triton",
        "cuda",
        "nvidia_driver",
        "gpu",
        "build_key",
    ):
        assert key in full
    generic = set(fingerprint("generic", JOB).ingredients)
    assert generic == {"python", "platform", "arch", "build_key"}
    assert fingerprint("triton", JOB).namespace.startswith("triton-")
    assert fingerprint("generic", JOB).namespace.startswith("generic-")


def test_versions_come_from_metadata() -> None:
    from importlib.metadata import version

    ingredients = fingerprint("inductor", JOB).ingredients
    assert ingredients["torch"] == version("torch")
    assert ingredients["triton"] == version("triton")


def test_explicit_namespace_overrides() -> None:
    assert resolve_namespace("triton", "team-a.v2") == "team-a.v2"
    assert resolve_namespace("triton", None, JOB) == fingerprint("triton", JOB).namespace
    assert resolve_namespace("triton", "auto", JOB) == fingerprint("triton", JOB).namespace


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "..", "a b", "x" * 129, "ns\n", "é", "a\0b"])
def test_bad_namespaces_rejected(bad: str) -> None:
    with pytest.raises(UsageError) as info:
        check_namespace(bad)
    assert "\n" not in info.value.message
    with pytest.raises(UsageError):
        resolve_namespace("generic", bad)


def test_good_namespaces_accepted() -> None:
    for good in ("a", "x" * 128, "triton-0123abcd", "A.b_c-9"):
        assert check_namespace(good) == good


def test_unknown_family_rejected() -> None:
    with pytest.raises(UsageError):
        fingerprint("rustc")
    with pytest.raises(UsageError):
        resolve_namespace("rustc", "explicit")


def test_does_not_import_torch_or_triton() -> None:
    code = (
        "import json, sys\n"
        "from casfs.fingerprint import fingerprint, job_env\n"
        "job = job_env(python=sys.executable)\n"
        "ns = [fingerprint(f, job).namespace for f in ('triton', 'inductor', 'generic')]\n"
        "mods = [m for m in ('torch', 'triton') if m in sys.modules]\n"
        "print(json.dumps({'ns': ns, 'mods': mods}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout)
    assert result["mods"] == []
    assert result["ns"][0] == fingerprint("triton", JOB).namespace


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_interpreter_resolution_order(tmp_path: Path) -> None:
    """--python, else the command or its shebang, else $VIRTUAL_ENV, else python3 on PATH."""
    venv, bindir = tmp_path / "venv", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    bindir.mkdir()
    vpy = _script(venv / "bin" / "python", "#!/bin/sh\n")
    py3 = _script(bindir / "python3", "#!/bin/sh\n")
    _script(bindir / "train", f"#!{vpy}\nprint('hi')\n")
    _script(bindir / "serve", "#!/usr/bin/env python3\n")
    shell = _script(bindir / "job.sh", "#!/bin/sh\n")
    env = {"PATH": str(bindir)}
    assert resolve_interpreter(["python3", "x.py"], env) == str(py3)
    assert resolve_interpreter(["train"], env) == str(vpy)  # console script: its shebang
    assert resolve_interpreter(["serve"], env) == str(py3)  # env python3 on the job's PATH
    assert resolve_interpreter(["job.sh"], env) == str(py3)  # not Python: python3 on PATH
    assert resolve_interpreter(["job.sh"], {**env, "VIRTUAL_ENV": str(venv)}) == str(vpy)
    assert resolve_interpreter(["train"], env, python=str(py3)) == str(py3)
    assert resolve_interpreter([], {"PATH": str(tmp_path / "empty")}) is None
    assert shell.exists()
    with pytest.raises(UsageError, match="no such executable"):
        resolve_interpreter([], env, python=str(tmp_path / "nope"))


def test_the_jobs_packages_not_casfs_own(tmp_path: Path) -> None:
    """Another interpreter's metadata makes the key: a venv without torch has torch None."""
    venv = tmp_path / "jobvenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    bare = job_env(python=str(venv / "bin" / "python"), env={"PATH": "/usr/bin:/bin"})
    assert bare.python == JOB.python and bare.packages.get("torch") is None
    fp = fingerprint("inductor", bare)
    assert fp.ingredients["torch"] is None and fp.ingredients["triton"] is None
    assert fp.namespace != fingerprint("inductor", JOB).namespace
    # Found through the job's PYTHONPATH, the packages count (it is the job's environment).
    site = next((Path(sys.prefix) / "lib").glob("python3*/site-packages"))
    withpath = job_env(python=str(venv / "bin" / "python"),
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)})
    assert withpath.packages["torch"] == JOB.packages["torch"]
    # The job's command decides: `casfs run -- <venv>/bin/python train.py`.
    assert job_env([str(venv / "bin" / "python"), "train.py"]).interpreter == str(
        venv / "bin" / "python")


def test_differences() -> None:
    assert differences({"torch": "2.13.0", "gpu": None}, {"torch": "2.14.0", "gpu": None}) == [
        ("torch", "2.13.0", "2.14.0")]
    assert differences({"a": "1"}, {}) == [("a", "1", None)]


def test_key_compare_exit_status(tmp_path: Path) -> None:
    def key(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "casfs.cli.main", "key", "--family",
                               "triton,inductor", *args], capture_output=True, text=True,
                              timeout=120, check=False)

    mine = key("--json", "--python", sys.executable)
    assert mine.returncode == 0
    (tmp_path / "a.json").write_text(mine.stdout)
    other = json.loads(mine.stdout)
    other[0]["namespace"], other[0]["ingredients"]["torch"] = "triton-0000000000000000", "9.9"
    (tmp_path / "b.json").write_text(json.dumps(other))
    same = key("--python", sys.executable, "--compare", str(tmp_path / "a.json"))
    assert same.returncode == 0 and "same key" in same.stdout
    differ = key("--python", sys.executable, "--compare", str(tmp_path / "a.json"),
                 str(tmp_path / "b.json"))
    assert differ.returncode == 1
    assert "triton:" in differ.stdout and "9.9" in differ.stdout and "inductor" not in differ.stdout
    (tmp_path / "bad.json").write_text("{")
    bad = key("--compare", str(tmp_path / "bad.json"))
    assert bad.returncode == 2 and "not a casfs key --json output" in bad.stderr


def test_probe_cache_answers_until_a_path_entry_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """casfs run keeps the job interpreter's probe; installing anything reprobes."""
    from casfs import fingerprint as fp

    site = tmp_path / "site"
    (site / "torch-9.9.9.dist-info").mkdir(parents=True)
    (site / "torch-9.9.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}
    cache = tmp_path / "state" / "probes.json"
    runs: list[object] = []
    real_run = subprocess.run

    def counted(*a: object, **kw: object) -> object:
        runs.append(a)
        return real_run(*a, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(fp.subprocess, "run", counted)
    fp._probe.cache_clear()
    assert fp.job_env_kept(python=sys.executable, env=env, cache=cache) is None
    first = fp.job_env(python=sys.executable, env=env, cache=cache)
    assert first.packages["torch"] == "9.9.9" and len(runs) == 1 and cache.exists()
    fp._probe.cache_clear()  # a new CLI process: only the file remains
    assert fp.job_env(python=sys.executable, env=env, cache=cache) == first
    # What casfs run asks before it starts the node's mount process: no interpreter run.
    assert fp.job_env_kept(python=sys.executable, env=env, cache=cache) == first
    assert len(runs) == 1  # answered from the cache
    # An upgrade: a new dist-info (and the old one gone) changes the directory.
    (site / "torch-9.9.9.dist-info" / "METADATA").unlink()
    (site / "torch-9.9.9.dist-info").rmdir()
    (site / "torch-10.0.dist-info").mkdir()
    (site / "torch-10.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 10.0\n")
    fp._probe.cache_clear()
    assert fp.job_env_kept(python=sys.executable, env=env, cache=cache) is None
    assert fp.job_env(python=sys.executable, env=env, cache=cache).packages["torch"] == "10.0"
    assert len(runs) == 2
    fp._probe.cache_clear()


def test_the_gpu_is_asked_once_for_every_family(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``casfs run`` fingerprints every default family and most name the GPU:
    nvidia-smi (a process that initialises the driver) runs once, not once a family."""
    from casfs import fingerprint as fp

    calls = tmp_path / "calls"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'NVIDIA H200, 9.0'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(fp, "_gpus_seen", None)
    job = fp.JobEnv(sys.executable, "3.11.7", "glibc 2.36", {})
    named = [f for f in families.default_run()
             if "gpu" in families.get(f).ingredients]
    assert len(named) >= 3, named
    assert not fp.gpus_known()  # casfs run does not ask it before its mount process
    fps = [fp.fingerprint(f, job) for f in named]
    assert fp.gpus_known()
    assert {f.ingredients["gpu"] for f in fps} == {"NVIDIA H200/9.0"}
    assert len(calls.read_text().splitlines()) == 1
    monkeypatch.setattr(fp, "_GPUS_FOR", 0.0)  # stale: asked again
    fp.fingerprint(named[0], job)
    assert len(calls.read_text().splitlines()) == 2


def test_the_gpu_answer_is_kept_for_the_boot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``casfs run``'s next job (a new process) names its namespaces without nvidia-smi:
    the answer is kept beside the probe cache for as long as the boot, the driver, the
    GPU devices seen and nvidia-smi itself stay the same; a failed answer is not kept."""
    from casfs import fingerprint as fp

    calls = tmp_path / "calls"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'NVIDIA H200, 9.0'\n")
    smi.chmod(0o755)
    boot, dev = tmp_path / "boot_id", tmp_path / "dev"
    boot.write_text("b1\n")
    dev.mkdir()
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(fp, "_BOOT_ID_FILE", str(boot))
    monkeypatch.setattr(fp, "_DEV_DIR", str(dev))
    monkeypatch.setattr(fp, "_gpus_file", None)

    def new_process() -> None:  # what a process starts with
        monkeypatch.setattr(fp, "_gpus_seen", None)
        fp.keep_gpus_in(tmp_path / "state" / "run" / "gpus.json")

    def asked() -> int:
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    new_process()
    assert not fp.gpus_known()
    assert fp._gpus() == "NVIDIA H200/9.0" and asked() == 1
    new_process()
    assert fp.gpus_known()  # casfs run reads its namespaces ahead on this node now
    assert fp._gpus() == "NVIDIA H200/9.0" and asked() == 1
    for change in (lambda: boot.write_text("b2\n"),  # a reboot
                   lambda: os.symlink("/dev/null", dev / "nvidia0")):  # a GPU seen
        change()
        new_process()
        assert not fp.gpus_known()
        before = asked()
        fp._gpus()
        assert asked() == before + 1
    kept = (tmp_path / "state" / "run" / "gpus.json").read_bytes()
    smi.write_text(f"#!/bin/sh\necho x >> {calls}\nexit 9\n")  # fails: asked again
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fp.log, "warning", lambda *a: None)
        for _ in range(2):
            new_process()
            assert not fp.gpus_known()
            assert fp._gpus() is None
    assert asked() == before + 3
    assert (tmp_path / "state" / "run" / "gpus.json").read_bytes() == kept
    monkeypatch.setattr(fp, "_gpus_seen", None)
    fp.keep_gpus_in(None)
