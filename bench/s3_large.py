"""Peak memory of ``casfs import`` of one large file into an S3 root (SeaweedFS on loopback).

Usage: ``python -m bench.s3_large [--mib 128 286] [--workdir DIR]``

Prints one JSON document: for each size, the peak RSS of the import process
(``wait4``'s ru_maxrss of that child alone) and its wall time, beside the peak
of importing one small file into the same root (the interpreter and its
imports). The file is random bytes, so it is stored raw, as large as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from seaweed import seaweed


def _import(src: Path, ns: str, env: dict[str, str]) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of one ``casfs import`` process."""
    t = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "casfs.cli.main", "import", str(src), "-n", ns],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stderr is not None
    err = p.stderr.read().decode()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"casfs import failed ({p.returncode}): {err[-500:]}")
    return usage.ru_maxrss / 1024, time.monotonic() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, nargs="+", default=[128, 286])
    ap.add_argument("--workdir")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="casfs-s3large-"))
    out: dict[str, Any] = {"load_avg": os.getloadavg()[0], "sizes": []}
    try:
        with seaweed(work / "seaweed") as srv:
            srv.create_bucket("casfs-bench")
            url = f"s3://casfs-bench/large?endpoint={srv.endpoint}"
            env = dict(os.environ, **srv.env(), CASFS_ROOT=url,
                       CASFS_STATE_DIR=str(work / "state"))
            subprocess.run([sys.executable, "-m", "casfs.cli.main", "init", url], env=env,
                           check=True, capture_output=True)
            small = work / "small"
            small.mkdir()
            (small / "f").write_bytes(b"x" * 1000)
            out["small_import_peak_rss_mib"] = round(_import(small, "small", env)[0], 1)
            for mib in args.mib:
                src = work / f"big{mib}"
                src.mkdir()
                with open(src / "model.bin", "wb") as f:
                    for _ in range(mib):
                        f.write(os.urandom(1 << 20))
                rss, secs = _import(src, f"big{mib}", env)
                out["sizes"].append({"file_mib": mib, "peak_rss_mib": round(rss, 1),
                                     "seconds": round(secs, 2)})
                shutil.rmtree(src)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
