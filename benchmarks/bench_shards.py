"""Sharded builds: N = 1, 2, 4 slices of the shipped manifests, merged.

For each N, runs `cutlass-aot build --shard I/N` for I = 1..N one after the
other (each slice is what one CI job would run; the wall time of each is
recorded), then `cutlass-aot merge` of the N shard caches into a fresh
cache, and compares that with the N = 1 build: the same keys, and for every
key the same artifact bytes (sha256) and the same runtime library. Every
step is a real subprocess. Writes benchmarks/results/<date>_shards.md.

    nice -n 10 python benchmarks/bench_shards.py --work /tmp/shards [--jobs 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import header, write

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> tuple[float, dict, int]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "cutlass_aot.cli", *args, "--json"],
                         capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    try:
        data = json.loads(res.stdout)
    except ValueError:
        raise SystemExit(f"{args}: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}") from None
    return wall, data, res.returncode


def entries(cache: Path) -> dict[str, tuple[str, str]]:
    idx = json.loads((cache / "index.json").read_text())
    return {k: (r["sha256"], r["runtime"]) for k, r in idx["entries"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", default="/tmp/cutlass-aot-shards")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--counts", default="1,2,4")
    ap.add_argument("--extra", nargs="*", default=[], help="extra build flags, e.g. --no-bundle-runtime")
    ap.add_argument("--out", default=None)
    ap.add_argument("manifests", nargs="*", default=None)
    args = ap.parse_args()
    manifests = args.manifests or [str(p) for p in sorted((ROOT / "configs").glob("*.yaml"))]
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    counts = [int(c) for c in args.counts.split(",")]
    rows, checks, reference = [], [], None
    for n in counts:
        shard_dirs = []
        for i in range(1, n + 1):
            d = work / f"n{n}-s{i}"
            wall, data, rc = cli("build", *manifests, "--cache-dir", str(d), "--jobs", str(args.jobs),
                                 "--shard", f"{i}/{n}", *args.extra)
            if rc != 0:
                raise SystemExit(f"shard {i}/{n} failed: {data}")
            compile_s = sum(r["build_seconds"] for r in json.loads((d / "index.json").read_text())
                            ["entries"].values())
            rows.append((n, i, data["shard"]["keys"], data["built"], wall, compile_s))
            print(f"N={n} shard {i}: {data['shard']['keys']} keys, {wall:.1f}s", flush=True)
            shard_dirs.append(d)
        merged = work / f"n{n}-merged"
        mwall, mdata, mrc = cli("merge", *map(str, shard_dirs), "--cache-dir", str(merged))
        got = entries(merged)
        if reference is None:
            reference = got
        same_keys = set(got) == set(reference)
        same_bytes = same_keys and all(got[k] == reference[k] for k in reference)
        vwall, vdata, vrc = cli("verify", "--cache-dir", str(merged))
        checks.append((n, len(got), mdata["added"], mrc, mwall, same_keys, same_bytes, vrc == 0))
        print(f"N={n} merged: {len(got)} entries, same keys {same_keys}, same bytes {same_bytes}", flush=True)

    text = header("Sharded builds and merge (cross-compile for sm_90a, no GPU)")
    text += (f"Manifests: {', '.join(Path(m).name for m in manifests)}; `--jobs {args.jobs}` per shard; "
             f"extra flags: `{' '.join(args.extra) or '-'}`. Shards of one N ran one after the other "
             "on this machine (each is what one CI runner would run). The build machine has 2 cores "
             "shared with other work, so absolute times are noisy; compare shards within a row.\n\n")
    text += "| N | shard | keys | built | wall s | sum of compile s |\n|---|---|---|---|---|---|\n"
    for n, i, keys, built, wall, comp in rows:
        text += f"| {n} | {i}/{n} | {keys} | {built} | {wall:.1f} | {comp:.1f} |\n"
    text += ("\nMerge of the N shard caches into an empty cache, compared with the N = 1 build "
             "(keys, and per key the artifact's sha256 and its runtime's sha256):\n\n")
    text += ("| N | entries | added by merge | merge exit | merge s | same keys | same bytes | verify clean |\n"
             "|---|---|---|---|---|---|---|---|\n")
    for n, count, added, rc, wall, sk, sb, ok in checks:
        text += f"| {n} | {count} | {added} | {rc} | {wall:.1f} | {sk} | {sb} | {ok} |\n"
    name = f"{dt.date.today().isoformat()}_shards.md"
    print(write(name, text, args.out))


if __name__ == "__main__":
    main()
