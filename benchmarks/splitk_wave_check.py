"""How does a split-K variant compare with its plain sibling, by waves? From bench_selection's raw timings (CPU only).

For every shape of ``--raw`` files and each (tile, cluster) with both a
plain variant (raster m, swizzle 1) and a split-K one, the ratio
time(split-K at its best split count) / time(plain), grouped by how many
waves of tiles the plain variant runs (tiles / cluster slots). The hybrid
splits only the last partial wave, so with several whole waves it should
cost the plain variant's time plus at most one reduce pass; a ratio well
above 1 there means its whole waves run slower.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

from _common import header, load_raw, write
from fit_model import parse_label

from cutlass_aot.run import select

BANDS = ((0, 1), (1, 3), (3, 10), (10, math.inf))


def ratios(path: str, sms: int = 132) -> dict:
    out = defaultdict(list)
    for rec in load_raw(path):
        plain, split = {}, {}
        for label, key, _splits, us, _ in rec["options"]:
            c, _ = parse_label(label, key)
            if c.swap_ab or (c.raster, c.swizzle) != ("m", 1):
                continue
            tc = (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n)
            if c.split_k:
                split[tc] = min(split.get(tc, math.inf), us)
            else:
                plain[tc] = (us, c)
        for tc, us in split.items():
            if tc not in plain:
                continue
            p_us, c = plain[tc]
            _, _, tiles = select._tiles(c, rec["m"], rec["n"], 1)
            size = c.cluster_m * c.cluster_n
            waves = (tiles // size) / max(1, sms // size)
            band = next(b for b in BANDS if b[0] <= waves < b[1])
            out[(band, f"{tc[0]}x{tc[1]}/{tc[2]}x{tc[3]}")].append(us / p_us)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", nargs="+")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    text = header("Split-K variants against their plain siblings, by waves")
    text += ("time(split-K, best split count) / time(plain, same tile and cluster), one sweep per "
             "option (device time); geometric mean per band of the plain variant's waves.\n\n"
             "| raw | waves | tile/cluster | n | geomean split-K / plain |\n|---|---|---|---|---|\n")
    for path in args.raw:
        for (band, tc), xs in sorted(ratios(path).items()):
            g = math.exp(sum(map(math.log, xs)) / len(xs))
            hi = "inf" if band[1] == math.inf else band[1]
            text += f"| {path.split('/')[-1]} | {band[0]}-{hi} | {tc} | {len(xs)} | {g:.3f} |\n"
    print(text)
    print("wrote", write("splitk_wave_check.md", text, args.out))


if __name__ == "__main__":
    main()
