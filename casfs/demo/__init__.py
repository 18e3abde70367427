"""Real-client workloads used as cache probes.

Each module runs as ``python -m casfs.demo.<name> --json`` in a fresh process
(so no in-memory cache masks the on-disk one) and prints one JSON line with
its cache hits and misses as the client itself counts them, plus a checksum
of its results so a caller can check that a cache hit gave the same answer.
"""
