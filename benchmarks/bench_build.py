"""Build-side benchmark: cold build of the shipped sm90 manifest, a no-op
rebuild, and build time against --jobs on a fixed subset.

Every run is a real `cutlass-aot build` subprocess (spawned compile
workers, real cross-compiles for sm_90a) into a fresh temp cache. Prints a
table and writes benchmarks/results/<date>_build.md (or --out).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from _common import cli_build as build
from _common import header, write

ROOT = Path(__file__).resolve().parent.parent

SUBSET = """arch: sm_90a
kernels:
  - family: sm90_gemm
    params:
      a: [bf16, f16]
      b_major: [k, n]
      tile: [128x256, 128x128]
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-cold", action="store_true", help="skip the full-manifest cold build")
    args = ap.parse_args()
    rows = []
    tmp = tempfile.mkdtemp(prefix="cutlass-aot-bench-")
    try:
        shipped = [str(ROOT / "configs" / "sm90.yaml")]
        if not args.skip_cold:
            cache = os.path.join(tmp, "full")
            wall, rep = build(shipped, cache, os.cpu_count() or 1)
            rows.append(("cold build, configs/sm90.yaml", os.cpu_count(), rep["total"], rep["built"], wall))
            print(rows[-1], flush=True)
            for _ in range(3):
                wall, rep = build(shipped, cache, os.cpu_count() or 1)
                rows.append(("no-op rebuild, configs/sm90.yaml", os.cpu_count(), rep["total"], rep["built"], wall))
                print(rows[-1], flush=True)
        subset = os.path.join(tmp, "subset.yaml")
        Path(subset).write_text(SUBSET)
        for jobs in sorted({1, 2, os.cpu_count() or 1}):
            cache = os.path.join(tmp, f"jobs{jobs}")
            wall, rep = build([subset], cache, jobs)
            rows.append((f"cold build, 8-variant subset, --jobs {jobs}", jobs, rep["total"], rep["built"], wall))
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = header("Build benchmark (cross-compile for sm_90a, no GPU)")
    text += ("Wall time of a whole `cutlass-aot build` process (Python start, manifest, plan, spawn "
             "workers, compile, link, publish). The build machine has "
             f"{os.cpu_count()} cores.\n\n")
    text += "| run | jobs | variants | compiled | wall s | s per compiled variant |\n|---|---|---|---|---|---|\n"
    for name, jobs, total, built, wall in rows:
        per = f"{wall / built:.2f}" if built else "-"
        text += f"| {name} | {jobs} | {total} | {built} | {wall:.2f} | {per} |\n"
    print(text)
    print("wrote", write("build.md", text, args.out))


if __name__ == "__main__":
    main()
