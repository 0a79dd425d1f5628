"""Build time of every shipped manifest (all archs) on this machine: cold and no-op.

A real `cutlass-aot build configs/*.yaml` subprocess (spawned compile
workers, real cross-compiles for sm_80, sm_86, sm_89, sm_90 and sm_90a) into
a fresh temp cache, then the same command again (no-op: every variant cached),
then one cold build per manifest into fresh caches for the per-arch split
(--per-manifest). Writes benchmarks/results/<date>_build_archs.md (or --out).

    python3 benchmarks/bench_build_archs.py [--jobs N] [--per-manifest] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import tempfile
from pathlib import Path

from _common import cli_build as build
from _common import header, write

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--per-manifest", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shipped = sorted(str(p) for p in (ROOT / "configs").glob("*.yaml"))
    rows = []
    tmp = tempfile.mkdtemp(prefix="cutlass-aot-bench-")
    try:
        cache = os.path.join(tmp, "all")
        wall, rep = build(shipped, cache, args.jobs)
        rows.append(("cold, all shipped manifests", rep["total"], rep["built"], wall))
        print(rows[-1], flush=True)
        for _ in range(3):
            wall, rep = build(shipped, cache, args.jobs)
            rows.append(("no-op rebuild, all shipped manifests", rep["total"], rep["cached"], wall))
            print(rows[-1], flush=True)
        if args.per_manifest:
            for m in shipped:
                wall, rep = build([m], os.path.join(tmp, Path(m).stem), args.jobs)
                rows.append((f"cold, {Path(m).relative_to(ROOT)}", rep["total"], rep["built"], wall))
                print(rows[-1], flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = header("Build time of all shipped manifests (every arch)")
    text += (f"`cutlass-aot build configs/*.yaml --jobs {args.jobs}` as a subprocess into a fresh "
             f"cache (cold), then again (no-op). Machine: {os.cpu_count()} cores, shared with other "
             "work while measured, so cold times are upper bounds.\n\n")
    text += "| run | variants | built or cached | wall s |\n|---|---|---|---|\n"
    text += "\n".join(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1f} |" for r in rows) + "\n"
    print(write(f"{dt.date.today().isoformat()}_build_archs.md", text, args.out))


if __name__ == "__main__":
    main()
