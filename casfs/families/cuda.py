"""The CUDA driver's PTX JIT ComputeCache (``CUDA_CACHE_PATH``).

Layout: an ``index`` file at the top and entries under two levels of hex
shard directories. The driver rewrites ``index`` in place as entries are
added (a binary format casfs does not parse), so it is replaced, newest
wins; entries are immutable. The cache is keyed by the driver and the GPU,
not by Python packages. ``CUDA_CACHE_MAXSIZE`` (default 256 MiB, max 4 GiB)
is an opt-in companion: too small a cache evicts what casfs restored.
"""

from __future__ import annotations

from casfs.families.base import NEWEST, Family, ReplacedPath, common_scratch

FAMILY = Family(
    name="cuda",
    summary="CUDA driver PTX JIT ComputeCache (CUDA_CACHE_PATH)",
    env_vars=("CUDA_CACHE_PATH",),
    companions={"CUDA_CACHE_MAXSIZE": str(4 * 1024**3)},
    ingredients=("platform", "arch", "nvidia_driver", "gpu", "build_key"),
    scratch=common_scratch,
    replaced=(ReplacedPath("index", NEWEST, "the driver rewrites its index in place"),),
)
