"""Fixed-bucket latency histograms, small enough to travel in a status reply.

A mount counts latencies (how long an open waited for a lower object, how
long a publication took) with ``Counters.observe``; its status carries
``{"histograms": {name: {"le": [...], "counts": [...], "sum": s}}}``, and
casfsd's metrics endpoint (casfs.daemon.metrics) sums those of a family and
tenant into one Prometheus histogram. ``counts`` are per bucket, not
cumulative; the last one counts what is above the highest bound (``+Inf``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import Any

# Seconds: a warm fetch from a local disk takes ~1 ms, a cold one from S3 at 20 ms RTT
# ~50-200 ms, a publication of a few hundred files on NFS ~0.1-2 s; fetch_timeout is
# 10 s by default, and a publication over a minute is a problem, not a bucket.
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                      0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """Observation counts per bucket and their sum (not thread-safe: Counters locks)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"histogram bounds must increase: {bounds}")
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # Prometheus' le: a value equal to a bound counts in that bound's bucket.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def to_dict(self) -> dict[str, Any]:
        return {"le": list(self.bounds), "counts": list(self.counts), "sum": round(self.sum, 6)}


def parse(data: object) -> tuple[tuple[float, ...], list[int], float] | None:
    """(bounds, counts, sum) of a serialised histogram, or None if it is malformed."""
    if not isinstance(data, Mapping):
        return None
    le, counts, total = data.get("le"), data.get("counts"), data.get("sum")
    try:
        bounds = tuple(float(b) for b in le)  # type: ignore[union-attr]
        ints = [int(c) for c in counts]  # type: ignore[union-attr]
        s = float(total)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if len(ints) != len(bounds) + 1 or any(c < 0 for c in ints):
        return None
    return bounds, ints, s


def merge(a: dict[str, Any] | None, b: object) -> dict[str, Any] | None:
    """``a`` plus the serialised histogram ``b`` (``a`` unchanged if ``b`` does not fit:
    malformed, or other bounds)."""
    pb = parse(b)
    if pb is None:
        return a
    if a is None:
        return {"le": list(pb[0]), "counts": list(pb[1]), "sum": pb[2]}
    pa = parse(a)
    if pa is None or pa[0] != pb[0]:
        return a
    return {"le": list(pa[0]), "counts": [x + y for x, y in zip(pa[1], pb[1], strict=True)],
            "sum": pa[2] + pb[2]}


def cumulative(data: dict[str, Any]) -> list[tuple[str, int]]:
    """Prometheus buckets: (le, observations <= le), ending with ``+Inf``."""
    parsed = parse(data)
    if parsed is None:
        return [("+Inf", 0)]
    bounds, counts, _ = parsed
    out, running = [], 0
    for b, c in zip(bounds, counts, strict=False):
        running += c
        out.append((_le(b), running))
    out.append(("+Inf", running + counts[-1]))
    return out


def _le(b: float) -> str:
    return repr(b)  # 0.001, 1.0, 60.0: what prometheus_client writes for float bounds
