"""Where the model ties a tile's 1x1 cluster with its 1x2 or 2x1, which ran faster? (CPU only)

Where the tensor cores bound a unit, ``select._unit_us`` gives a tile the
same time in every cluster shape of up to 2 CTAs, so the model's order among
them is its tie-break. Per recorded shape of the input raws (bench_selection.py
or tile_probe.py records, fit-side only), every plain (not split-K, K-cluster
or pingpong) option whose 1x2 or 2x1 sibling (same tile, raster, swizzle and
swap) has exactly the same estimate is compared with it: the report gives,
per sibling and tile class, the geomean of sibling / 1x1 measured time and the
shares faster or slower by more than 2%. r34 chose select.rank_key's cluster
tie-break on it (benchmarks/results/2026-12-04_h200_r34_notes.md).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from _common import gmean
from fit_model import load

from cutlass_aot.run import select


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raws", nargs="+", help="fit-side raws (fit_inputs.py output or recorded)")
    ap.add_argument("--sms", type=int, default=132)
    args = ap.parse_args()
    ratios = defaultdict(list)
    for path in args.raws:
        for s in load(path):
            m, n, k = s["m"], s["n"], s["k"]
            by = {}
            for c, splits, us in s["opts"]:
                if c.gemv or c.k_cluster > 1 or c.split_k or c.pingpong:
                    continue
                est = select.estimate_us(c, splits, m, n, k, 1, args.sms)
                by[(c.tile_m, c.tile_n, c.swap_ab, c.raster, c.swizzle, c.cluster_m, c.cluster_n)] = (us, est)
            for key, (us, est) in by.items():
                if key[5:] != (1, 1):
                    continue
                for cluster in ((1, 2), (2, 1)):
                    sibling = by.get(key[:5] + cluster)
                    if sibling and sibling[1] == est:
                        size = "256/192-row" if key[0] >= 192 else "64/128-row"
                        ratios[(f"{cluster[0]}x{cluster[1]}", size)].append(sibling[0] / us)
    print("| sibling | tiles | ties | sibling / 1x1: geomean | faster > 2% | slower > 2% |\n|---|---|---|---|---|---|")
    for (cluster, size), r in sorted(ratios.items()):
        print(f"| {cluster} | {size} | {len(r)} | {gmean(r):.3f} | {sum(x < 0.98 for x in r) / len(r):.0%} "
              f"| {sum(x > 1.02 for x in r) / len(r):.0%} |")


if __name__ == "__main__":
    main()
