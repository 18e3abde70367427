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

import importlib.metadata
import json
import logging
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

import blake3

from casfs import families
from casfs.errors import UsageError

log = logging.getLogger(__name__)

AUTO = "auto"
BUILD_KEY_ENV = "CASFS_BUILD_KEY"

_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
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
    """Return ``name`` if it can be a namespace directory name; raise UsageError otherwise."""
    if not isinstance(name, str) or not _NAMESPACE_RE.fullmatch(name) or name.startswith("."):
        raise UsageError(
            f"invalid namespace {name!r:.80}: use 1-128 of [A-Za-z0-9._-], not starting with '.'"
        )
    return name


def fingerprint(family: str) -> Fingerprint:
    """Collect this host's ingredients for ``family``."""
    fam = families.get(family)
    probes: dict[str, Callable[[], str | None]] = {
        "python": _python,
        "platform": platform.system,
        "arch": platform.machine,
        "libc": _libc,
        "cuda": _cuda_runtime,
        "nvidia_driver": _nvidia_driver,
        "gpu": _gpus,
        "build_key": lambda: os.environ.get(BUILD_KEY_ENV) or None,
    }
    ingredients: dict[str, str | None] = {}
    for key in fam.ingredients:
        probe = probes.get(key)
        value = probe() if probe is not None else _first_version(fam.package_dists(key))
        ingredients[key] = value or None
    return Fingerprint(family=family, ingredients=ingredients)


def resolve_namespace(family: str, namespace: str | None) -> str:
    """An explicit namespace wins; ``None`` or ``"auto"`` means this host's fingerprint."""
    check_family(family)
    if namespace is None or namespace == AUTO:
        return fingerprint(family).namespace
    return check_namespace(namespace)


def _python() -> str:
    major, minor, _ = platform.python_version_tuple()
    return f"{platform.python_implementation().lower()}-{major}.{minor}"


def _libc() -> str | None:
    lib, version = platform.libc_ver()
    return f"{lib}-{version}" if lib else None


def _first_version(dists: tuple[str, ...]) -> str | None:
    for name in dists:
        version = _package_version(name)
        if version:
            return version
    return None


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cuda_runtime() -> str | None:
    """CUDA runtime torch was built for, else the installed nvidia runtime wheel."""
    torch_version = _package_version("torch")
    if torch_version:
        match = _TORCH_CUDA_SUFFIX_RE.search(torch_version)
        if match:
            return f"{match.group(1)}.{match.group(2)}"
        if "+cpu" in torch_version:
            return None
    # Wheels: nvidia-cuda-runtime-cu12 (CUDA 12) and nvidia-cuda-runtime (CUDA 13).
    versions = sorted(
        {
            dist.version
            for dist in importlib.metadata.distributions()
            if (dist.metadata["Name"] or "").lower().startswith("nvidia-cuda-runtime")
        }
    )
    return ",".join(versions) or None


def _nvidia_driver() -> str | None:
    try:
        with open(_DRIVER_VERSION_FILE, encoding="utf-8", errors="replace") as f:
            text = f.read(4096)
    except OSError:
        return None
    # "NVRM version: NVIDIA UNIX [Open ]Kernel Module [for x86_64]  550.54.15  ..."
    for line in text.splitlines():
        if line.startswith("NVRM"):
            match = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", line + " ")
            if match:
                return match.group(1)
    return None


def _gpus() -> str | None:
    """Model and compute capability of every GPU, e.g. ``NVIDIA H200/9.0``."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
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
        return None
    if proc.returncode != 0:
        log.warning("nvidia-smi exited %d, GPU left out of the fingerprint", proc.returncode)
        return None
    gpus = set()
    for line in proc.stdout.splitlines():
        name, _, cap = line.partition(",")
        if name.strip():
            gpus.add(f"{name.strip()}/{cap.strip()}")
    # A mixed node gets its own namespace: artifacts may target either model.
    return ";".join(sorted(gpus)) or None
