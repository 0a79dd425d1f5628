"""Where the cache trails cuBLAS, by problem band, from recorded sweeps (CPU only).

Input: ``bench_selection.py --raw`` files (every option of every shape timed,
cuBLAS re-timed next to the best). For each band of M x K (and of the
output-tile count at 128x128 against the 132 SMs), the geomean of cuBLAS
time over the best cached option's time: below 1, the best kernel the cache
holds is slower than cuBLAS there, whatever selection does. This points
kernel work at the bands that cost the most; it fits nothing.

    python benchmarks/heldout_bands.py benchmarks/results/raw/*_r10_selection_heldout_*_raw.json.xz
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

from _common import best_vs, gmean, load_raw

M_EDGES = (16, 128, 512, 4096, 65536)
K_EDGES = (1024, 4096, 16384)
TILE_EDGES = (66, 132, 264, 528, 2000)


def band(x: int, edges: tuple[int, ...]) -> tuple[int, str]:
    """(index, label) of the band of ``x``: 1-e0, e0+1-e1, ..., >e_last."""
    lo = 1
    for i, e in enumerate(edges):
        if x <= e:
            return i, f"{lo}-{e}"
        lo = e + 1
    return len(edges), f">{edges[-1]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", nargs="+")
    args = ap.parse_args()
    recs = [r for path in args.raw for r in load_raw(path)]
    by_mk: dict[tuple, list[float]] = defaultdict(list)
    by_tiles: dict[tuple, list[float]] = defaultdict(list)
    for r in recs:
        ratio = best_vs(r)
        by_mk[(band(r["m"], M_EDGES), band(r["k"], K_EDGES))].append(ratio)
        tiles = math.ceil(r["m"] / 128) * math.ceil(r["n"] / 128)
        by_tiles[band(tiles, TILE_EDGES)].append(ratio)
    print(f"{len(recs)} shapes; best cached option vs cuBLAS, geomean (below 1: cuBLAS faster)\n")
    print("| M | K | shapes | best / cuBLAS |\n|---|---|---|---|")
    for (mb, kb), v in sorted(by_mk.items()):
        print(f"| {mb[1]} | {kb[1]} | {len(v)} | {gmean(v):.3f} |")
    print("\n| 128x128 output tiles | shapes | best / cuBLAS |\n|---|---|---|")
    for tb, v in sorted(by_tiles.items()):
        print(f"| {tb[1]} | {len(v)} | {gmean(v):.3f} |")


if __name__ == "__main__":
    main()
