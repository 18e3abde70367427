"""Namespace fingerprints: what makes compiled artifacts incompatible.

An ``auto`` namespace is ``<family>-<hash16>``, where ``hash16`` is the first
16 hex digits of blake3 over the canonical JSON of the ingredients. Two nodes
share a namespace exactly when every ingredient matches, so a cache is only
ever served to an environment that can use it ("restores but still
recompiles" is the symptom of a missing ingredient; wrong bytes would be the
symptom of a missing one that matters).

Everything here is cheap and side-effect free: package versions come from
metadata, never from importing torch or triton (an import costs seconds and
may initialise CUDA in the daemon).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import blake3

from casfs import families
from casfs.errors import UsageError
from casfs.util import names

log = logging.getLogger(__name__)

AUTO = "auto"
BUILD_KEY_ENV = "CASFS_BUILD_KEY"

_NVIDIA_SMI_TIMEOUT_S = 5.0
_DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
# "+cu128" -> 12.8, "+cu118" -> 11.8; the last digit is always the minor.
_TORCH_CUDA_SUFFIX_RE = re.compile(r"\+cu(\d+)(\d)\b")


@dataclass(frozen=True)
class Fingerprint:
    """The ingredients of one family's namespace on this host."""

    family: str
    ingredients: dict[str, str | None] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        canonical = json.dumps(
            self.ingredients, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        return blake3.blake3(canonical.encode("utf-8")).hexdigest()[:16]

    @property
    def namespace(self) -> str:
        return f"{self.family}-{self.digest}"

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form, as ``casfs key --json`` prints it."""
        return {
            "family": self.family,
            "namespace": self.namespace,
            "ingredients": dict(sorted(self.ingredients.items())),
        }


def check_family(family: str) -> str:
    return families.check(family)


def check_namespace(name: str) -> str:
    """Return ``name`` if it can be a namespace name (casfs.util.names); UsageError if not."""
    return names.check_namespace(name)


# Run by the job's interpreter: its Python, libc and package versions, from
# metadata only (nothing is imported). Works on any Python 3.8+.
_PROBE = r"""
import json, platform, sys
out = {"python": "%s-%d.%d" % ((platform.python_implementation().lower(),)
                               + tuple(sys.version_info[:2])),
       "libc": "-".join(platform.libc_ver()).strip("-") or None, "packages": {}}
try:
    from importlib import metadata
except ImportError:
    metadata = None
for name in sys.argv[1:]:
    try:
        out["packages"][name] = metadata.version(name) if metadata else None
    except Exception:
        out["packages"][name] = None
out["path"] = [p for p in sys.path if p]  # where the metadata came from (probe cache)
print(json.dumps(out))
"""
_PROBE_TIMEOUT_S = 30.0
# Wheels: nvidia-cuda-runtime-cu12 (CUDA 12) and nvidia-cuda-runtime (CUDA 13).
_CUDA_WHEELS = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12",
                "nvidia-cuda-runtime-cu11")


@dataclass(frozen=True)
class JobEnv:
    """What the job's interpreter says about itself (None values: not installed)."""

    interpreter: str | None
    python: str | None
    libc: str | None
    packages: dict[str, str | None]

    def version(self, dists: tuple[str, ...]) -> str | None:
        for name in dists:
            if self.packages.get(name):
                return self.packages[name]
        return None


def _all_dists() -> list[str]:
    names = {d for f in families.names() for k in families.get(f).ingredients
             if k not in families.HOST_INGREDIENTS for d in families.get(f).package_dists(k)}
    return sorted(names | {"torch", *_CUDA_WHEELS})


def _is_python(path: str) -> bool:
    return re.fullmatch(r"(python|pypy)[0-9.]*", os.path.basename(path)) is not None


def _which(name: str, env: Mapping[str, str]) -> str | None:
    if "/" in name:
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name, path=env.get("PATH", os.defpath))


def _shebang_python(path: str, env: Mapping[str, str]) -> str | None:
    """The interpreter a script's ``#!`` line names, if it is a Python."""
    try:
        with open(path, "rb") as f:
            line = f.readline(512)
    except OSError:
        return None
    if not line.startswith(b"#!"):
        return None
    parts = line[2:].decode("utf-8", "replace").split()
    if parts and os.path.basename(parts[0]) == "env":
        parts = [p for p in parts[1:] if not p.startswith("-")]
    if not parts or not _is_python(parts[0]):
        return None
    return _which(parts[0], env)


def resolve_interpreter(cmd: Sequence[str] = (), env: Mapping[str, str] | None = None,
                        python: str | None = None) -> str | None:
    """The interpreter the job's command resolves to.

    ``python`` (``--python``), else the command itself when it is a Python or
    a script whose ``#!`` names one, else ``$VIRTUAL_ENV/bin/python``, else
    ``python3`` on the job's PATH. None if there is none.
    """
    env = os.environ if env is None else env
    if python:
        found = _which(python, env)
        if found is None:
            raise UsageError(f"--python {python}: no such executable")
        return found
    if cmd:
        exe = _which(cmd[0], env)
        if exe is not None:
            if _is_python(exe) or _is_python(os.path.realpath(exe)):
                return exe
            found = _shebang_python(exe, env)
            if found is not None:
                return found
    venv = env.get("VIRTUAL_ENV")
    if venv and os.access(os.path.join(venv, "bin", "python"), os.X_OK):
        return os.path.join(venv, "bin", "python")
    return _which("python3", env)


@functools.lru_cache(maxsize=16)
def _probe(interpreter: str, env_items: tuple[tuple[str, str], ...],
           cache: str | None = None) -> JobEnv:
    key = _probe_key(interpreter, env_items) if cache else None
    doc = _cached_probe(cache, key) if cache and key else None
    try:
        if doc is None:
            proc = subprocess.run([interpreter, "-c", _PROBE, *_all_dists()],
                                  capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S,
                                  env=dict(env_items), check=False, stdin=subprocess.DEVNULL,
                                  cwd="/")  # '' (the cwd) is first on sys.path under -c
            doc = json.loads(proc.stdout)
            if cache and key:
                _store_probe(cache, key, doc)
        return _job_env_of(interpreter, doc)
    except (OSError, subprocess.SubprocessError, ValueError, AttributeError) as e:
        log.warning("cannot read the packages of %s (left out of the fingerprint): %s",
                    interpreter, e)
        return JobEnv(interpreter, None, None, {})


def _job_env_of(interpreter: str, doc: dict[str, Any]) -> JobEnv:
    return JobEnv(interpreter, doc.get("python"), doc.get("libc"),
                  {k: v for k, v in doc.get("packages", {}).items() if isinstance(k, str)})


# --- the probe cache: one interpreter start (~0.1 s, more in a large venv) saved per job ---
# A probe's answer is kept with the identity of the interpreter, the environment it
# ran in, the list of packages asked about, and the mtime of every sys.path entry it
# searched: installing, upgrading or removing a distribution adds or removes a
# *.dist-info / *.egg-info entry in one of them, which changes that mtime.
_PROBE_CACHE_MAX = 32


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _probe_key(interpreter: str, env_items: tuple[tuple[str, str], ...]) -> str | None:
    try:
        st = os.stat(interpreter)
    except OSError:
        return None
    # The working directory too: the probe's sys.path starts with it (a source tree
    # holding an *.egg-info answers for its package there).
    ident = [interpreter, os.path.realpath(interpreter), st.st_ino, st.st_size,
             st.st_mtime_ns, list(env_items), _all_dists(), os.getcwd()]
    return blake3.blake3(json.dumps(ident).encode()).hexdigest()[:32]


def _read_probe_cache(cache: str) -> dict[str, Any]:
    try:
        with open(cache, "rb") as f:
            doc = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _cached_probe(cache: str, key: str) -> dict[str, Any] | None:
    hit = _read_probe_cache(cache).get(key)
    if not isinstance(hit, dict) or not isinstance(hit.get("doc"), dict):
        return None
    paths = hit.get("paths")
    if not isinstance(paths, list) or not all(
            isinstance(p, list) and len(p) == 2 and _mtime(str(p[0])) == p[1] for p in paths):
        return None  # something was installed or removed since: probe again
    return dict(hit["doc"])


def _store_probe(cache: str, key: str, doc: dict[str, Any]) -> None:
    from casfs.util.atomic import write_atomic

    found = doc.get("path")
    if not isinstance(found, list):
        return
    entries = _read_probe_cache(cache)
    entries.pop(key, None)
    while len(entries) >= _PROBE_CACHE_MAX:
        entries.pop(next(iter(entries)))
    entries[key] = {"doc": doc, "paths": [[p, _mtime(p)] for p in found if isinstance(p, str)]}
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        write_atomic(cache, json.dumps(entries).encode())
    except OSError as e:
        log.debug("probe cache %s not written: %s", cache, e)


# The environment a probe runs in: the job's PYTHONPATH counts (packages found through
# it are the job's).
_PROBE_ENV = ("PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "HOME", "LD_LIBRARY_PATH")


def job_env(cmd: Sequence[str] = (), env: Mapping[str, str] | None = None,
            python: str | None = None, *, cache: str | os.PathLike[str] | None = None
            ) -> JobEnv:
    """The job's interpreter and its package versions (see ``resolve_interpreter``).

    ``cache``: a file keeping probe answers until the interpreter or a directory
    on its sys.path changes (casfs run and casfs env: in the node state dir).
    """
    interpreter, keep = _probe_input(cmd, env, python)
    if interpreter is None:
        return JobEnv(None, None, None, {})
    return _probe(interpreter, keep, os.fspath(cache) if cache is not None else None)


def _probe_input(cmd: Sequence[str], env: Mapping[str, str] | None, python: str | None
                 ) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """The job's interpreter and the environment its probe runs in."""
    env = dict(os.environ if env is None else env)
    keep = tuple(sorted((k, v) for k, v in env.items() if k in _PROBE_ENV))
    return resolve_interpreter(cmd, env, python), keep


def job_env_kept(cmd: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 python: str | None = None, *, cache: str | os.PathLike[str]) -> JobEnv | None:
    """``job_env``'s answer without starting the interpreter: from ``cache``, if an earlier
    probe of the same interpreter and environment is still valid there; else None."""
    interpreter, keep = _probe_input(cmd, env, python)
    if interpreter is None:
        return JobEnv(None, None, None, {})
    key = _probe_key(interpreter, keep)
    doc = _cached_probe(os.fspath(cache), key) if key else None
    try:
        return _job_env_of(interpreter, doc) if doc is not None else None
    except AttributeError:  # a damaged entry: the probe runs again
        return None


def fingerprint(family: str, job: JobEnv | None = None) -> Fingerprint:
    """The ingredients of ``family`` for a job (default: the caller's environment's job)."""
    fam = families.get(family)
    jenv = job if job is not None else job_env()
    probes: dict[str, Callable[[], str | None]] = {
        "python": lambda: jenv.python,
        "platform": platform.system,
        "arch": platform.machine,
        "libc": lambda: jenv.libc,
        "cuda": lambda: _cuda_runtime(jenv),
        "nvidia_driver": _nvidia_driver,
        "gpu": _gpus,
        "build_key": lambda: os.environ.get(BUILD_KEY_ENV) or None,
    }
    ingredients: dict[str, str | None] = {}
    for key in fam.ingredients:
        probe = probes.get(key)
        value = probe() if probe is not None else jenv.version(fam.package_dists(key))
        ingredients[key] = value or None
    return Fingerprint(family=family, ingredients=ingredients)


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(ingredient, value in a, value in b) for every ingredient that differs."""
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def resolve_namespace(family: str, namespace: str | None, job: JobEnv | None = None) -> str:
    """An explicit namespace wins; ``None`` or ``"auto"`` means the job's fingerprint."""
    check_family(family)
    if namespace is None or namespace == AUTO:
        return fingerprint(family, job).namespace
    return check_namespace(namespace)


def _cuda_runtime(job: JobEnv) -> str | None:
    """CUDA runtime the job's torch was built for, else its nvidia runtime wheel."""
    torch_version = job.packages.get("torch")
    if torch_version:
        match = _TORCH_CUDA_SUFFIX_RE.search(torch_version)
        if match:
            return f"{match.group(1)}.{match.group(2)}"
        if "+cpu" in torch_version:
            return None
    versions = sorted({v for n in _CUDA_WHEELS if (v := job.packages.get(n))})
    return ",".join(versions) or None


def _read_small(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(4096)
    except OSError:
        return None


def _nvidia_driver() -> str | None:
    text = _read_small(_DRIVER_VERSION_FILE)
    if text is None:
        return None
    # "NVRM version: NVIDIA UNIX [Open ]Kernel Module [for x86_64]  550.54.15  ..."
    for line in text.splitlines():
        if line.startswith("NVRM"):
            match = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", line + " ")
            if match:
                return match.group(1)
    return None


# nvidia-smi is a process that initialises the driver (slow without persistence mode),
# and most families' fingerprints name the GPU: ``casfs run`` fingerprints ten of them,
# one after the other, before its job starts. One answer stands this long in a process
# (a reload of casfsd after a reconfiguration asks again) ...
_GPUS_FOR = 30.0
_gpus_seen: tuple[float, str | None] | None = None
# ... and, once a file is named (``keep_gpus_in``: casfs run and casfs env, in the node
# state dir), across processes for as long as nothing it depends on changes: the boot,
# the driver, the GPU devices this process sees (a container sees its own), nvidia-smi
# itself. Every job after a node's first then names its namespaces without nvidia-smi.
_gpus_file: str | None = None
_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
_DEV_DIR = "/dev"
_GPUS_DIR = "/proc/driver/nvidia/gpus"
_NVIDIA_DEV_RE = re.compile(r"nvidia\d+")


def keep_gpus_in(path: str | os.PathLike[str] | None) -> None:
    """Keep this process's nvidia-smi answer in ``path`` for the next ones (None: not)."""
    global _gpus_file
    _gpus_file = os.fspath(path) if path is not None else None


def _gpus() -> str | None:
    """Model and compute capability of every GPU, e.g. ``NVIDIA H200/9.0`` (nvidia-smi
    asked at most once every _GPUS_FOR seconds, or once a boot with ``keep_gpus_in``)."""
    global _gpus_seen
    seen = _gpus_standing()
    if seen is not None:
        return seen[1]
    exe = shutil.which("nvidia-smi")
    key = _gpus_key(exe) if exe is not None and _gpus_file is not None else None
    kept = _kept_gpus(key) if key is not None else None
    if kept is not None:
        value = kept[0]
    else:
        value, answered = _query_gpus(exe)
        if answered and key is not None:
            _keep_gpus(key, value)
    _gpus_seen = (time.monotonic(), value)
    return value


def gpus_known() -> bool:
    """Whether a fingerprint naming the GPU is computed now without starting nvidia-smi
    (no nvidia-smi here, an answer still standing, or one kept for this boot)."""
    global _gpus_seen
    if _gpus_standing() is not None:
        return True
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return True
    key = _gpus_key(exe) if _gpus_file is not None else None
    kept = _kept_gpus(key) if key is not None else None
    if kept is None:
        return False
    _gpus_seen = (time.monotonic(), kept[0])  # the fingerprints take it from here
    return True


def _gpus_key(exe: str) -> str | None:
    """What an nvidia-smi answer depends on (None: not known, so never kept)."""
    boot = _read_small(_BOOT_ID_FILE)
    if not boot:
        return None
    try:
        st = os.stat(exe)
        devices = sorted((n, os.stat(os.path.join(_DEV_DIR, n)).st_rdev)
                         for n in os.listdir(_DEV_DIR) if _NVIDIA_DEV_RE.fullmatch(n))
    except OSError:
        return None
    try:
        gpus = sorted(os.listdir(_GPUS_DIR))
    except OSError:
        gpus = []
    ident = [boot.strip(), _read_small(_DRIVER_VERSION_FILE), devices, gpus,
             [exe, st.st_ino, st.st_size, st.st_mtime_ns]]
    return blake3.blake3(json.dumps(ident).encode()).hexdigest()[:32]


def _kept_gpus(key: str) -> tuple[str | None] | None:
    """The answer kept for ``key``, as a 1-tuple (its value may be None: no GPU)."""
    if _gpus_file is None:
        return None
    try:
        with open(_gpus_file, "rb") as f:
            doc = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != key:
        return None
    value = doc.get("gpus")
    return (value,) if value is None or isinstance(value, str) else None


def _keep_gpus(key: str, value: str | None) -> None:
    from casfs.util.atomic import write_atomic

    assert _gpus_file is not None
    try:
        os.makedirs(os.path.dirname(_gpus_file), exist_ok=True)
        write_atomic(_gpus_file, json.dumps({"key": key, "gpus": value}).encode())
    except OSError as e:
        log.debug("GPU answer not kept in %s: %s", _gpus_file, e)


def _gpus_standing() -> tuple[float, str | None] | None:
    seen = _gpus_seen
    return seen if seen is not None and time.monotonic() - seen[0] < _GPUS_FOR else None


def _query_gpus(exe: str | None) -> tuple[str | None, bool]:
    """nvidia-smi's answer, and whether it answered (a failure is not kept: asked again)."""
    if exe is None:
        return None, False
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvidia-smi failed, GPU left out of the fingerprint: %s", exc)
        return None, False
    if proc.returncode != 0:
        log.warning("nvidia-smi exited %d, GPU left out of the fingerprint", proc.returncode)
        return None, False
    gpus = set()
    for line in proc.stdout.splitlines():
        name, _, cap = line.partition(",")
        if name.strip():
            gpus.add(f"{name.strip()}/{cap.strip()}")
    # A mixed node gets its own namespace: artifacts may target either model.
    return ";".join(sorted(gpus)) or None, True
