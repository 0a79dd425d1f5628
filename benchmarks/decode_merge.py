"""The decode grid's summary from several bench_decode.py raws: a grid that one
run's budget cut and a later ``--start N`` run finished.

Each raw comes with the copy bandwidth its own run measured (the HBM column's
denominator), as ``PATH@TBPS``. Problems must not repeat across the raws, and
the report says which grid problems none of them has. CPU only: it reads the
JSON files that bench_decode.py's ``--raw`` wrote.

    python benchmarks/decode_merge.py r48_raw.json.xz@4.26 r50_raw.json@4.24
"""

from __future__ import annotations

import argparse
import json
import lzma
import statistics
import sys

from _common import gmean
from bench_decode import DT, MS, NKS, SHARES, problem_bytes


def load(spec: str) -> tuple[list[dict], float]:
    """One ``PATH@TBPS`` argument: the raw's records and its run's copy bandwidth."""
    path, sep, bw = spec.rpartition("@")
    if not sep or not path:
        sys.exit(f"decode_merge: {spec!r}: give each raw as PATH@TBPS (its run's copy bandwidth)")
    try:
        tbps = float(bw)
    except ValueError:
        sys.exit(f"decode_merge: {spec!r}: {bw!r} is not a bandwidth in TB/s")
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        return json.load(f), tbps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raws", nargs="+", metavar="PATH@TBPS")
    args = ap.parse_args()
    rows, seen = [], {}
    for spec in args.raws:
        records, tbps = load(spec)
        for r in records:
            key = (r["dtype"], r["m"], r["n"], r["k"])
            if key in seen:
                sys.exit(f"decode_merge: {key} is in both {seen[key]} and {spec}")
            seen[key] = spec
            rows.append((r, tbps))
    grid = [(d, m, n, k) for d in DT for n, k in NKS for m in MS]
    missing = [p for p in grid if p not in seen]
    ratios = [r["cublas_us"] / r["pick_us"] for r, _ in rows]
    fracs = [problem_bytes(r["m"], r["n"], r["k"]) / r["pick_us"] / 1e6 / bw for r, bw in rows
             if r["m"] <= 16 and r["n"] * r["k"] * 2 >= 32e6]
    print(f"problems: {len(rows)} of the grid's {len(grid)}; missing: {missing or 'none'}")
    print(f"pick vs cuBLAS, graph: geomean {gmean(ratios):.3f}, min {min(ratios):.2f}")
    print(f"M <= 16 with weights >= 32 MB: HBM fraction median {statistics.median(fracs):.0%}, "
          f"min {min(fracs):.0%} (n={len(fracs)}); at or above 85%: "
          f"{sum(f >= 0.85 for f in fracs)}")
    shares = []
    for s in SHARES:
        floored = [r["cublas_us"] / min(r["pick_us"],
                                        problem_bytes(r["m"], r["n"], r["k"]) / (s * bw * 1e12) * 1e6)
                   for r, bw in rows]
        shares.append(f"{gmean(floored):.3f}")
    print("had every problem run at least at " + " / ".join(f"{s:.0%}" for s in SHARES)
          + " of its run's copy bandwidth: geomean " + " / ".join(shares))
    below = sorted(zip(ratios, (r for r, _ in rows)), key=lambda t: t[0])[:8]
    print("lowest: " + ", ".join(f"{r['dtype']} {r['m']}x{r['n']}x{r['k']} {x:.2f}" for x, r in below))


if __name__ == "__main__":
    main()
